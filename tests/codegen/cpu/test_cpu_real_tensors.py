"""The generated kernels on real weights of both models match numerics.matmul and are batch invariant."""

from __future__ import annotations

import numpy as np
import pytest
from cpu_kernel_helpers import assert_matches_reference
from gguf import GGMLQuantizationType as Q

from kinetic import hub
from kinetic.codegen.cpu.matmul import quantized_matmul
from kinetic.frontend.gguf_file import GGUFFile

ROWS = 300
CASES = [
    ("smollm2-135m", "blk.0.ffn_down.weight", Q.Q4_1),
    ("smollm2-135m", "blk.3.attn_q.weight", Q.Q4_1),
    ("smollm2-135m", "token_embd.weight", Q.Q8_0),
    ("gemma3-270m", "blk.0.attn_k.weight", Q.Q5_0),
    ("gemma3-270m", "blk.0.attn_output.weight", Q.Q4_K),
    ("gemma3-270m", "blk.0.ffn_down.weight", Q.Q6_K),
    ("gemma3-270m", "token_embd.weight", Q.Q8_0),
]


def _tensor(model: str, name: str):
    try:
        path = hub.resolve_model(model)
    except Exception as exc:  # a missing model skips, any other failure is the test's
        pytest.skip(f"{model} not available: {exc}")
    gguf = GGUFFile(path)
    return gguf.tensors[name], np.array(gguf.array(name)[:ROWS])


@pytest.mark.parametrize("model,name,wtype", CASES, ids=[f"{m}:{n}" for m, n, _ in CASES])
def test_real_tensor_rows(jit, model, name, wtype):
    """First 300 rows of a real tensor: reference agreement, and 7 rows together equal each row alone."""
    tensor, raw = _tensor(model, name)
    assert tensor.type == wtype
    k = tensor.ne[0]
    x = np.random.default_rng(k).standard_normal((7, k)).astype(np.float32)
    batch = quantized_matmul(x, raw, wtype, jit=jit, threads=2)
    assert_matches_reference(batch, x, raw, wtype)
    alone = quantized_matmul(x[3:4], raw, wtype, jit=jit)
    np.testing.assert_array_equal(batch[3:4].view(np.uint32), alone.view(np.uint32))
