"""The compiled step's attention (step_attention.attend_items, with the generated score and softmax
kernels or its numba path) gives bit for bit what `numerics.attention_online` gives, softcap, odd
head dims, arbitrary visibility and rows that see nothing included, in both orders of an f16 cache
("key_chain_f16": an f16 accumulator; "key_chain_f16_acc32": an f32 one)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kinetic.codegen.cpu.attention_ir import heads_per_call, render_scores, render_softmax
from kinetic.codegen.cpu.jit import default_jit
from kinetic.codegen.cpu.step_attention import attend_items
from kinetic.ir import numerics
from kinetic.ir.numerics.attention import f16_cache_accumulator

ORDERS = ["key_chain_f16", "key_chain_f16_acc32"]
pytestmark = pytest.mark.skipif(numerics._LIBM is None, reason="the C library cannot be loaded")

CASES = [
    # n_head, n_kv_head, head_dim, softcap, scale
    (9, 3, 64, 0.0, 0.125),
    (4, 1, 256, 0.0, 1.0),
    (8, 8, 64, 50.0, 0.125),
    (4, 2, 256, 30.0, 0.0625),
    (3, 1, 96, 0.0, 0.1),  # a tail past the last chunk of 64: numba path
    (2, 2, 32, 20.0, 0.2),  # no full chunk at all: numba path
]


def _bits(x) -> np.ndarray:
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def _attend(q, keys, vals, mask, a, kernels: bool, vector_expf: bool | None = None) -> np.ndarray:
    """Every key is a pass row of one sequence (nothing committed); anc carries the visibility.
    vector_expf: render_softmax's (None: the guard's choice)."""
    rows, n = mask.shape
    nh, nkv, hd = a.n_head, a.n_kv_head, a.head_dim
    arena = np.zeros(2 * rows * nh * hd, np.float32)
    arena[: rows * nh * hd] = q.reshape(-1)
    keys, vals = np.ascontiguousarray(keys), np.ascontiguousarray(vals)
    anc = np.zeros((n, n), np.uint8)
    anc[:rows] = mask
    if a.softcap:
        scale, cap = np.float32(np.float32(a.scale) / np.float32(a.softcap)), np.float32(a.softcap)
    else:
        scale, cap = np.float32(a.scale), np.float32(0)
    score_fn = softmax_fn = 0
    heads = 1
    accumulator = f16_cache_accumulator(a)
    if kernels and hd % 64 == 0:
        heads = heads_per_call(nh // nkv, nkv, 1)
        score_fn = default_jit().address(*render_scores(hd, heads))
        softmax_fn = default_jit().address(*render_softmax(hd, heads, bool(a.softcap), vector_expf,
                                                           accumulator=accumulator))
    kp, vp = np.array([keys.ctypes.data], np.int64), np.array([vals.ctypes.data], np.int64)
    positions = row_slot = np.zeros(n, np.int32)
    items = rows * nh // heads
    attend_items(arena, 0, rows * nh * hd, kp, vp, nkv * hd, nh, nkv, hd, scale, cap, 0, 0, items, 1, positions,
                 row_slot, np.arange(n, dtype=np.int32)[None, :], np.zeros(1, np.int64),
                 np.array([np.zeros(1, np.int32).ctypes.data], np.int64), anc, score_fn, softmax_fn, heads,
                 int(scale.view(np.uint32)), int(cap.view(np.uint32)), accumulator == "f32")
    return arena[rows * nh * hd :].reshape(rows, nh * hd)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("kernels", [True, False], ids=["generated", "numba"])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("seed", range(4))
def test_step_attention_bit_identical_to_reference(case, seed, kernels, order):
    """Decode and short passes over random keys (causal, windowed, scattered, nothing seen): every
    row's bits are the reference's in the node's order, with the generated kernels and numba."""
    nh, nkv, hd, cap, scale = CASES[case]
    rng = np.random.default_rng(1000 * case + seed)
    a = SimpleNamespace(n_head=nh, n_kv_head=nkv, head_dim=hd, scale=scale, softcap=cap, order=order)
    rows = int(rng.integers(1, 25))
    n = int(rng.integers(rows, 200))
    q = (rng.standard_normal((rows, nh * hd)) * rng.uniform(0.1, 8)).astype(np.float32)
    keys = (rng.standard_normal((n, nkv * hd)) * rng.uniform(0.1, 8)).astype(np.float16)
    vals = (rng.standard_normal((n, nkv * hd)) * rng.uniform(1e-3, 4)).astype(np.float16)
    causal = np.arange(n)[None, :] <= np.arange(n - rows, n)[:, None]
    mask = [
        causal,
        causal & (np.arange(n)[None, :] > np.arange(n - rows, n)[:, None] - int(rng.integers(1, 64))),
        rng.random((rows, n)) < 0.7,
        np.zeros((rows, n), bool),  # a row that sees nothing gives zeros
    ][seed]
    ref = numerics.attention_online(q, keys, vals, mask, a)
    got = _attend(q, keys, vals, mask, a, kernels)
    assert np.array_equal(_bits(got), _bits(ref))


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("vector_expf", [True, False], ids=["vector-expf", "libm-expf"])
@pytest.mark.parametrize("case", [0, 1, 3])
def test_long_rows_windows_and_dead_keys(case, vector_expf, order):
    """Rows over 512-700 keys (many full blocks of the softmax's first pass and a masked last one),
    causal, sliding windows of 1-300 keys, scattered keys the row does not see and a run of 160
    (whole blocks with no key seen), and keys scoring -inf after a finite maximum (weight
    expf(-inf) = 0): the reference's bits with the vector expf and with the C library's."""
    nh, nkv, hd, cap, scale = CASES[case]
    rng = np.random.default_rng(77 + case)
    a = SimpleNamespace(n_head=nh, n_kv_head=nkv, head_dim=hd, scale=scale, softcap=cap, order=order)
    rows, n = 3, int(rng.integers(513, 700))
    q = np.abs(rng.standard_normal((rows, nh * hd)) * 2).astype(np.float32)
    keys = (rng.standard_normal((n, nkv * hd)) * 2).astype(np.float16)
    keys[rng.choice(np.arange(40, n), 12, replace=False)] = -np.inf  # q >= 0: these keys score -inf
    vals = (rng.standard_normal((n, nkv * hd))).astype(np.float16)
    pos = np.arange(n - rows, n)[:, None]
    causal = np.arange(n)[None, :] <= pos
    window = causal & (np.arange(n)[None, :] > pos - np.array([[1], [37], [300]]))
    holes = causal & (rng.random((rows, n)) < 0.5)
    gap = causal.copy()
    gap[:, 40:200] = False
    for mask in (causal, window, holes, gap):
        ref = numerics.attention_online(q, keys, vals, mask, a)
        assert np.array_equal(_bits(_attend(q, keys, vals, mask, a, True, vector_expf)), _bits(ref))


def test_head_dims_off_the_chunk_are_not_rendered():
    with pytest.raises(ValueError):
        render_scores(96)
    with pytest.raises(ValueError):
        render_softmax(32, 1, False)
    with pytest.raises(ValueError):
        render_softmax(64, 1, False, accumulator="f64")


@pytest.mark.parametrize("name", ["cosf", "sinf", "expf", "tanhf"])
def test_compiled_libm_map_is_the_references_libm(name):
    """The rotary tables' compiled cosf/sinf calls give numerics.libm_f32's values (the same C library)."""
    import ctypes

    from kinetic.codegen.common.libm import render_libm_map

    rng = np.random.default_rng(5)
    x = np.concatenate([rng.uniform(-1e5, 1e5, 100_000), rng.standard_normal(100_000) * 4]).astype(np.float32)
    y = np.empty_like(x)
    kernel = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
        default_jit().address(*render_libm_map(name)))
    kernel(x.ctypes.data, y.ctypes.data, x.size)
    assert np.array_equal(_bits(y), _bits(numerics.libm_f32(name, x)))
