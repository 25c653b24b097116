"""numerics.fma_f32 at the top of float32's range: a*b + c rounds once as IEEE 754 says, so a true sum
at or past FLT_MAX + half an ulp (the overflow edge) is +-inf and one below it is FLT_MAX; checked
against the hardware fma (llvm.fma through numba). `OVERFLOW_CASES` is shared with the device tests."""

from __future__ import annotations

import numpy as np

from kinetic.ir import numerics as nx

F32 = np.float32
F32_MAX = np.finfo(F32).max


def overflow_cases() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, c) f32 [n]: products past the edge with small addends of either sign (the float64 sum
    is inexact and its error points back below the edge), products exactly on the edge
    ((2^25 - 1) * 2^103 = 18631 * 1801 * 2^103) with addends of either sign and zero, products just
    below it, and random products around 2^128; every case also negated."""
    edge_a, edge_b = F32(18631 * 2.0**52), F32(1801 * 2.0**51)
    a = [F32(1.5 * 2**100), F32(1.5 * 2**100), edge_a, edge_a, edge_a, edge_a, edge_a, F32(2.0**64)]
    b = [F32(2.0**30), F32(2.0**30), edge_b, edge_b, edge_b, edge_b, edge_b, F32(2.0**64 - 2**40)]
    c = [F32(-1), F32(1), F32(-1), F32(1), F32(0), F32(-(2.0**-149)), F32(-(2.0**80)), F32(-3)]
    rng = np.random.default_rng(9)
    n = 4000
    ra = (rng.uniform(1, 2, n) * np.exp2(rng.integers(60, 68, n))).astype(F32)
    rb = (rng.uniform(1, 2, n) * np.exp2(127 - np.log2(ra.astype(np.float64)).astype(int))).astype(F32)
    rc = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 110, n))).astype(F32)
    a, b, c = (np.concatenate([np.array(x, F32), r]) for x, r in ((a, ra), (b, rb), (c, rc)))
    return np.concatenate([a, -a]), np.concatenate([b, b]), np.concatenate([c, -c])


def hardware_fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The CPU's fma instruction (the CPU device's kernels use it) on each element."""
    from numba import njit

    from kinetic.codegen.cpu.native import fma32

    @njit
    def run(a, b, c, out):
        for i in range(a.size):
            out[i] = fma32(a[i], b[i], c[i])

    out = np.empty_like(a)
    run(a, b, c, out)
    return out


def test_fma_f32_overflows_as_the_hardware_fma_does():
    """Past the overflow edge fma_f32 gives +-inf (never FLT_MAX because the addend's sign points
    back), exactly on it rounds to even (inf) unless the addend pulls the true sum below it (then
    FLT_MAX): the hardware fma's bits on every case."""
    a, b, c = overflow_cases()
    want = hardware_fma(a, b, c)
    got = nx.fma_f32(a, b, c)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.isinf(want).sum() > 100 and (np.abs(want) == F32_MAX).sum() >= 2  # both sides exercised
    assert got[0] == np.inf and got[2] == F32_MAX and got[4] == np.inf  # past, just below, on the edge
