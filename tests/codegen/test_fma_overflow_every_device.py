"""A matmul whose fma accumulators overflow gives the reference interpreter's bits on every device: the
reference's fma_f32 overflows to +-inf as the hardware fma does (tests/ir/test_fma_overflow.py), so
the CPU's and the CUDA emulation's fmas (the host's) and Vulkan's (the device's Fma or its float64
path) agree with it where an accumulator passes FLT_MAX.

The case: a Q2_K matmul (`acc = fma(f32(ints), d_w*d_x, acc)` per super-block, the float order of
numerics' _parts_dot) of rows whose first super-block is small and whose second is scaled towards
2^120, so that acc holds a small value of either sign when a product past FLT_MAX is added to it:
the float64 sum's error then points back below the edge for about half the outputs, where an fma
emulated without care returned FLT_MAX instead of infinity."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kinetic import devices
from kinetic.ir.rows import PassRows
from kinetic.ir.text import parse_graph
from kinetic.passes import PassOptions, run_pipeline
from kinetic.runtime.engine import Engine
from tests.codegen.test_batch_invariance_matrix import DEVICES, VOCAB, Case, RandomWeights

K, N_OUT = 512, 32
Q8_0_BLOCK, Q2_K_BLOCK = 34, 84
CASE = Case(K, N_OUT, f"""
%5 = param() {{tensor="w"}} : q2_k[{N_OUT},{K}]
%6 = scale(%4) {{factor={2.0**100!r}}} : f32[T,{K}]
%9 = matmul(%6, %5) : f32[T,{N_OUT}]""", (("w", Q.Q2_K, (N_OUT, K)),))


def _f16(value: float) -> np.ndarray:
    return np.frombuffer(np.float16(value).tobytes(), np.uint8)


def _overflowing_weights() -> RandomWeights:
    """Token rows with block scales 2^-20 over the first 256 values and 2^15 over the last; Q2_K
    weights with d = 1 and dmin = 0 (no minimums: the result is the accumulator itself)."""
    weights = RandomWeights(CASE, seed=3)
    table = weights.arrays["token_embd.weight"].reshape(VOCAB, K // 32, Q8_0_BLOCK)
    table[:, : 256 // 32, 0:2] = _f16(2.0**-20)
    table[:, 256 // 32 :, 0:2] = _f16(2.0**15)
    w = weights.arrays["w"].reshape(N_OUT, K // 256, Q2_K_BLOCK)
    w[:, :, 80:82], w[:, :, 82:84] = _f16(1.0), _f16(0.0)
    return weights


def _rows(device: str, tokens: list[int]) -> np.ndarray:
    d = devices.DEVICES[device]
    if d.unavailable():
        pytest.skip(f"{device}: {d.unavailable()}")
    graph = run_pipeline(parse_graph(CASE.text()), PassOptions(numerics=CASE.numerics))  # the case's mode
    if d.unsupported(graph):
        pytest.skip(f"{device} has no kernel for this case: {d.unsupported(graph)}")
    engine = Engine(graph, _overflowing_weights(), n_ctx=32, batch=8, device=device, threads=1)
    try:
        return engine.forward(PassRows.chain(tokens, 0, outputs="all"), {0: engine.new_sequence()})
    finally:
        engine.close()


@pytest.mark.parametrize("device", DEVICES[1:])
def test_overflowing_accumulators_are_the_references(device):
    """Eight rows whose accumulators pass FLT_MAX in about half the outputs give the reference's
    bits: +-inf where the true sum overflows, never FLT_MAX."""
    tokens = list(range(8))
    want = _rows("reference", tokens)
    assert np.isinf(want).sum() > N_OUT and not (np.abs(want) == np.finfo(np.float32).max).any()
    got = _rows(device, tokens)
    differ = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
    assert differ.size == 0, f"{len(differ)} differ, first {differ[:3].tolist()}: " \
                             f"{[(got[i, j], want[i, j]) for i, j in differ[:3]]}"
