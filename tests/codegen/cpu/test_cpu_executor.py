"""The CPU device (generated kernels for quantized matmuls) gives bit for bit what the reference
interpreter gives, on both real models."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.ir.rows import PassRows
from kinetic.passes import PassOptions, run_pipeline
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.conftest import model_path

TOKENS = [2, 504, 3575, 282, 4649, 314, 7042, 30]


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_cpu_device_equals_reference(name):
    gguf = open_gguf(model_path(name))
    graph = run_pipeline(lower(gguf), PassOptions())
    logits = {}
    for device in ("cpu", "reference"):
        engine = Engine(graph, GGUFWeights(gguf), n_ctx=64, device=device)
        logits[device] = engine.forward(PassRows.chain(TOKENS, 0, outputs="all"), {0: engine.new_sequence()})
    assert np.array_equal(logits["cpu"], logits["reference"])
