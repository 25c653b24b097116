"""The compiled CPU attention (kinetic/codegen/cpu/attention.py) gives bit for bit what
`numerics.attention_online` gives, and the C library functions it reaches through numba are the
reference's."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from numba import njit

from kinetic.codegen.cpu import attention
from kinetic.ir import numerics

pytestmark = pytest.mark.skipif(numerics._LIBM is None, reason="the C library cannot be loaded")


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def _window_mask(rng, rows: int, n: int, window: int) -> np.ndarray:
    """Rows are the last `rows` positions of `n` keys (causal), optionally inside a window."""
    pos_q = np.arange(n - rows, n)[:, None]
    pos_k = np.arange(n)[None, :]
    vis = pos_k <= pos_q
    if window:
        vis &= pos_k > pos_q - window
    return vis


CASES = [
    # n_head, n_kv_head, head_dim, softcap, scale
    (9, 3, 64, 0.0, 0.125),
    (4, 1, 256, 0.0, 1.0),
    (8, 8, 64, 50.0, 0.125),
    (4, 2, 256, 30.0, 0.0625),
    (3, 1, 96, 0.0, 0.1),  # a tail past the last chunk of 64
    (2, 2, 32, 20.0, 0.2),  # no full chunk at all
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("seed", range(4))
def test_attention_bit_identical_to_reference(case, seed):
    nh, nkv, hd, cap, scale = CASES[case]
    rng = np.random.default_rng(1000 * case + seed)
    a = SimpleNamespace(n_head=nh, n_kv_head=nkv, head_dim=hd, scale=scale, softcap=cap)
    rows = int(rng.integers(1, 41))
    n = int(rng.integers(rows, 301))
    q = (rng.standard_normal((rows, nh * hd)) * rng.uniform(0.1, 8)).astype(np.float32)
    keys = (rng.standard_normal((n, nkv * hd)) * rng.uniform(0.1, 8)).astype(np.float16)
    vals = (rng.standard_normal((n, nkv * hd)) * rng.uniform(1e-3, 4)).astype(np.float16)
    mask = [
        _window_mask(rng, rows, n, 0),
        _window_mask(rng, rows, n, int(rng.integers(1, 64))),
        rng.random((rows, n)) < 0.7,
        np.zeros((rows, n), bool),  # a row that sees nothing gives zeros
    ][seed]
    ref = numerics.attention_online(q, keys, vals, mask, a)
    got = attention.attention_online(q, keys, vals, mask, a)
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert np.array_equal(_bits(got), _bits(ref))


def test_rows_independent():
    rng = np.random.default_rng(7)
    a = SimpleNamespace(n_head=4, n_kv_head=2, head_dim=64, scale=0.125, softcap=0.0)
    q = rng.standard_normal((12, 256)).astype(np.float32)
    keys = rng.standard_normal((40, 128)).astype(np.float16)
    vals = rng.standard_normal((40, 128)).astype(np.float16)
    vis = _window_mask(rng, 12, 40, 16)
    whole = attention.attention_online(q, keys, vals, vis, a)
    for r in range(12):
        alone = attention.attention_online(q[r : r + 1], keys, vals, vis[r : r + 1], a)
        assert np.array_equal(_bits(alone[0]), _bits(whole[r]))


def test_large_values_and_f16_overflow():
    """Values near the f16 limit: the accumulator overflows to inf exactly where the reference's does."""
    rng = np.random.default_rng(3)
    a = SimpleNamespace(n_head=2, n_kv_head=1, head_dim=64, scale=0.01, softcap=0.0)
    q = rng.standard_normal((3, 128)).astype(np.float32)
    keys = rng.standard_normal((50, 64)).astype(np.float16)
    vals = (rng.choice([-1, 1], (50, 64)) * rng.uniform(3e4, 6.5e4, (50, 64))).astype(np.float16)
    vis = np.ones((3, 50), bool)
    with np.errstate(all="ignore"):
        ref = numerics.attention_online(q, keys, vals, vis, a)
    got = attention.attention_online(q, keys, vals, vis, a)
    same = (_bits(got) == _bits(ref)) | (np.isnan(got) & np.isnan(ref))
    assert same.all()


def test_f32_cache_uses_reference():
    rng = np.random.default_rng(5)
    a = SimpleNamespace(n_head=2, n_kv_head=1, head_dim=64, scale=0.125, softcap=0.0)
    q = rng.standard_normal((2, 128)).astype(np.float32)
    kv = rng.standard_normal((5, 64)).astype(np.float32)
    vis = np.ones((2, 5), bool)
    ref = numerics.attention_online(q, kv, kv, vis, a)
    assert np.array_equal(_bits(attention.attention_online(q, kv, kv, vis, a)), _bits(ref))


@njit
def _exp_all(x, out):
    for i in range(x.size):
        out[i] = np.float32(math.exp(x[i]))


@njit
def _tanh_all(x, out):
    for i in range(x.size):
        out[i] = np.float32(math.tanh(x[i]))


@njit
def _f16_all(x, out):
    for i in range(x.size):
        out[i] = attention._f16(x[i])


def _special_inputs() -> np.ndarray:
    values = [0.0, -0.0, np.inf, -np.inf, 88.72283, 88.72284, 88.7229, -87.33654, -103.972, -104.0, 1e-30, -1e-30]
    return np.array(values + [20.0, -20.0, 9.0, -9.0], np.float32)


def test_numba_expf_is_libm_expf():
    """math.exp on float32 in numba calls the process's expf: checked against the reference's
    ctypes expf on two million arguments covering its range, including underflow and overflow."""
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.uniform(-110, 90, 1_000_000), -rng.exponential(4.0, 1_000_000)]).astype(np.float32)
    x = np.concatenate([x, _special_inputs()])
    got = np.empty_like(x)
    _exp_all(x, got)
    assert np.array_equal(_bits(got), _bits(numerics.libm_f32("expf", x)))


def test_numba_tanhf_is_libm_tanhf():
    rng = np.random.default_rng(12)
    x = np.concatenate([rng.standard_normal(500_000) * 3, rng.uniform(-12, 12, 500_000)]).astype(np.float32)
    x = np.concatenate([x, _special_inputs()])
    got = np.empty_like(x)
    _tanh_all(x, got)
    assert np.array_equal(_bits(got), _bits(numerics.libm_f32("tanhf", x)))


def test_f16_rounding_is_numpys():
    """The accumulator's f32 -> f16 -> f32 rounding against numpy: random bit patterns and every f16
    value's neighbourhood (ties, just above/below ties, overflow, subnormals, signed zeros)."""
    rng = np.random.default_rng(13)
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    offsets = [0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF, -1, -0x1000, -0x1001]
    near = np.concatenate([(h.astype(np.int64) + d) & 0xFFFFFFFF for d in offsets]).astype(np.uint32)
    b = rng.integers(0, 2**32, 4_000_000, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([b, near]).view(np.float32)
    with np.errstate(all="ignore"):
        ref = x.astype(np.float16).astype(np.float32)
    got = np.empty_like(x)
    _f16_all(x, got)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(_bits(got)[~nan], _bits(ref)[~nan])
