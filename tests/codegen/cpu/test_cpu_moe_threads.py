"""MoE files on the compiled step with several threads (the family gate runs one): the router
kernels, the grouped expert products and their barriers give the reference interpreter's logits
bit for bit, and each row of a pass what it gets alone."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.codegen.cpu.step import CompiledStep
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.ir.rows import PassRows
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.device_checks import same_bits
from tests.synthetic import SYNTHETIC, synthetic_path

# 20 experts top-4 (softmax blocks and tail); sigmoid gate with selection bias; an F16 stack
FILES = ("qwen3moe-e20k4", "lfm2moe", "qwen3moe")
ROWS = 7


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("name", FILES)
def test_a_moe_prompt_on_threads_equals_the_reference_and_each_row_alone(name, threads):
    """A prompt pass on 2 or 3 threads gives the reference's logits for every row bit for bit, and
    the same rows decoded one at a time give the same bits."""
    gguf = open_gguf(synthetic_path(name))
    graph, weights = lower(gguf), GGUFWeights(gguf)
    prompt = np.load(SYNTHETIC / name / f"{name}.npz")["p0_ids"].tolist()[:ROWS]
    engine = Engine(graph, weights, n_ctx=32, device="cpu", threads=threads)
    assert isinstance(engine.runner, CompiledStep)
    reference = Engine(graph, weights, n_ctx=32, device="reference")
    rows = PassRows.chain(prompt, 0, outputs="all")
    batched = engine.forward(rows, {0: engine.new_sequence()})
    assert same_bits(batched, reference.forward(rows, {0: reference.new_sequence()}))
    alone = engine.new_sequence()
    assert same_bits(batched, np.stack([engine.decode(alone, t) for t in prompt]))
