"""The generated activation quantizers give numerics.py's Q8_0 / Q8_1 / Q8_K blocks bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.codegen.cpu.activation_ir import render_quantize
from kinetic.codegen.cpu.matmul import QUANT_SIG, quantize_activations
from kinetic.ir import numerics


def awkward_rows(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    """Rows with wide scales, an all-zero block, exact .5 ties after scaling and +-max magnitude ties."""
    x = (rng.standard_normal((m, k)) * np.exp(rng.uniform(-8, 8, (m, 1)))).astype(np.float32)
    x[0, :32] = 0.0
    if k >= 512:
        x[-1, 256:512] = 0.0
    x[m // 2, 32:64] = np.arange(-16, 16, dtype=np.float32) * 0.5  # scaled values land on halves
    x[-1, 64] = 100.0  # the same magnitude with both signs: the first one wins in Q8_K
    x[-1, 65] = -100.0
    x[-1, 0] = -100.0
    return x


@pytest.mark.parametrize("m,k", [(1, 256), (3, 512), (17, 1536)])
def test_q8_0_matches_reference(jit, m, k):
    """q and the f16-rounded d equal numerics.quantize_q8_0 exactly."""
    x = awkward_rows(np.random.default_rng(k + m), m, k)
    got = quantize_activations(x, "q8_0", jit)
    q, d = numerics.quantize_q8_0(x)
    np.testing.assert_array_equal(got.q, q.reshape(m, k))
    np.testing.assert_array_equal(got.d.view(np.uint32), d.view(np.uint32))


@pytest.mark.parametrize("m,k", [(1, 256), (5, 608)])
def test_q8_1_sums_match_reference(jit, m, k):
    """Q8_1 has Q8_0's q and d, and s equals numerics.q8_1_sums exactly."""
    x = awkward_rows(np.random.default_rng(k + m), m, k)
    got = quantize_activations(x, "q8_1", jit)
    q, d = numerics.quantize_q8_0(x)
    np.testing.assert_array_equal(got.q, q.reshape(m, k))
    np.testing.assert_array_equal(got.d, d)
    np.testing.assert_array_equal(got.extra.view(np.uint32), numerics.q8_1_sums(x).view(np.uint32))


@pytest.mark.parametrize("m,k", [(1, 256), (4, 768), (9, 2048)])
def test_q8_k_matches_reference(jit, m, k):
    """q, d (= 1/iscale, 0 for a zero block) and the sums of each 16 q equal numerics.quantize_q8_k."""
    x = awkward_rows(np.random.default_rng(k + m), m, k)
    got = quantize_activations(x, "q8_k", jit)
    q, d = numerics.quantize_q8_k(x)
    np.testing.assert_array_equal(got.q, q.reshape(m, k))
    np.testing.assert_array_equal(got.d.view(np.uint32), d.view(np.uint32))
    np.testing.assert_array_equal(got.extra, q.reshape(m, -1, 16).astype(np.int32).sum(axis=2))


def test_q8_k_first_largest_magnitude_sets_the_sign(jit):
    """With +a and -a both of largest magnitude, the first decides the scale's sign (q of it is -127)."""
    x = np.zeros((1, 256), np.float32)
    x[0, 3], x[0, 200] = 2.0, -2.0
    got = quantize_activations(x, "q8_k", jit)
    assert got.q[0, 3] == -127 and got.q[0, 200] == 127
    assert got.d[0, 0] < 0


def _blocks_with_a_scale_each(rng: np.random.Generator, n_blocks: int) -> np.ndarray:
    """f32 [n_blocks * 32]: every block its own magnitude (so every lane of a 16-block group holds a
    different amax), with ties, a zero block, a negative largest magnitude and denormal-only blocks
    where x * (127 / amax) overflows, an inf and a NaN, at lanes that vary from group to group."""
    x = rng.standard_normal((n_blocks, 32)).astype(np.float32) * np.exp(rng.uniform(-20, 20, (n_blocks, 1)))
    x = x.astype(np.float32)
    x[3] = 0.0
    x[18, :] = np.arange(-16, 16, dtype=np.float32) * 0.5
    x[21, 7], x[21, 9] = -1e30, 1e30
    x[37, :] = 0.0
    x[37, 5] = np.float32(1e-45)  # the smallest denormal: 127 / amax is inf, 0 * inf is NaN
    x[54, ::3] = np.float32(-3e-39)
    x[60, 4] = np.inf  # amax inf: inv 0, and inf * 0 is NaN in one lane only
    x[75, 30] = np.nan  # amax NaN: every lane NaN
    return x.reshape(-1)


def _quantize(jit, fmt: str, x: np.ndarray, grouped: bool):
    """(q, d, s) of the flat f32 x through render_quantize(fmt, grouped=grouped)."""
    nb = x.size // 32
    q, d, s = np.zeros(x.size, np.int8), np.zeros(nb, np.float32), np.zeros(nb, np.float32)
    QUANT_SIG(jit.address(*render_quantize(fmt, grouped=grouped)))(x.ctypes.data, q.ctypes.data, d.ctypes.data,
                                                                   s.ctypes.data, nb)
    return q, d, s


@pytest.mark.parametrize("fmt", ["q8_0", "q8_1"])
def test_grouped_blocks_match_one_block_at_a_time(jit, fmt):
    """Sixteen blocks a lane each give every block the bits the one-block code gives it (q, d, s),
    overflowing scales included, for 5 full groups and a tail of 7: a row's blocks do not depend
    on how many rows share a call."""
    x = _blocks_with_a_scale_each(np.random.default_rng(7), 16 * 5 + 7)
    with np.errstate(all="ignore"):
        grouped, single = _quantize(jit, fmt, x, True), _quantize(jit, fmt, x, False)
    np.testing.assert_array_equal(grouped[0], single[0])
    for a, b in zip(grouped[1:], single[1:], strict=True):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_grouped_q8_1_matches_reference_in_every_lane(jit):
    """With a different amax in every lane of every group, the grouped Q8_1 gives numerics' q, d and
    s exactly (the blocks where x * inv is inf or NaN left out: the reference's int8 cast of those
    is numpy's)."""
    nb = 16 * 5 + 7
    x = _blocks_with_a_scale_each(np.random.default_rng(11), nb)
    keep = np.ones(nb, bool)
    keep[[37, 54, 60, 75]] = False
    x = x.reshape(nb, 32)[keep].reshape(1, -1)
    q, d, s = _quantize(jit, "q8_1", x.reshape(-1), True)
    with np.errstate(over="ignore"):  # the 1e30 block's d is beyond f16: inf, in both
        (want_q, want_d), want_s = numerics.quantize_q8_0(x), numerics.q8_1_sums(x)
    np.testing.assert_array_equal(q, want_q.reshape(-1))
    np.testing.assert_array_equal(d.view(np.uint32), want_d.reshape(-1).view(np.uint32))
    np.testing.assert_array_equal(s.view(np.uint32), want_s.reshape(-1).view(np.uint32))
