"""Gemma 3 270M Q4_K_M (Q4_K weights, Q6_K ffn_down in half its layers) in the fast numerics mode on
the CPU: every matmul in "block_chain", and the CPU's bits the reference interpreter's, for decode and
for a prompt long enough for the 16-row lane tiles (both `slow`: the reference runs the whole model);
a row of a pass as alone."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kinetic.compiler import compile_graph
from kinetic.frontend.blocks import Options
from kinetic.frontend.gguf_file import open_gguf
from kinetic.ir.ops import Op
from kinetic.ir.rows import PassRows
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.device_checks import check_greedy_equals, check_row_in_a_pass_equals_row_alone, same_bits

LAYERS = (0, 17)  # the first and last of Gemma 3 270M's 18 layers


@pytest.fixture(scope="module")
def fast_engines(gemma_path):
    gguf = open_gguf(gemma_path)
    graph = compile_graph(gguf, Options(numerics="fast"))
    matmuls = [n for n in graph.nodes if n.op is Op.MATMUL]
    assert Q.Q6_K in {graph.node(n.inputs[1]).type.ggml_type for n in matmuls}
    assert all(n.attrs.order == "block_chain" for n in matmuls)
    weights = GGUFWeights(gguf)
    return (Engine(graph, weights, n_ctx=64, device="cpu", threads=2),
            Engine(graph, weights, n_ctx=64, device="reference"))


@pytest.mark.slow  # about 30 s: the reference interpreter runs the whole model
def test_fast_gemma_decode_equals_the_reference(fast_engines):
    """Greedy tokens, every step's logits and the cache: the CPU's bits are the reference's."""
    cpu, reference = fast_engines
    check_greedy_equals(cpu, reference, n=2, layers=LAYERS)


@pytest.mark.slow  # about 50 s
def test_fast_gemma_prompt_of_40_rows_equals_the_reference(fast_engines):
    """A 40-token prompt in one pass (two 16-row lane tiles and 8 rows left): every row's logits are
    the reference's bit for bit."""
    cpu, reference = fast_engines
    tokens = [int(t) for t in np.random.default_rng(0).integers(10, 2000, 40)]

    def logits(engine: Engine) -> np.ndarray:
        return engine.forward(PassRows.chain(tokens, 0, outputs="all"), {0: engine.new_sequence()})

    assert same_bits(logits(cpu), logits(reference))


def test_fast_gemma_rows_in_a_pass_equal_rows_alone(fast_engines):
    """A prompt in one pass gives each row its bits decoded alone (the fast orders are per row)."""
    check_row_in_a_pass_equals_row_alone(fast_engines[0], layers=LAYERS)
