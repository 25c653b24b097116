"""The two orders of attention over an f16 cache in the reference (numerics.attention_online): ggml's
"key_chain_f16" (an f16 value accumulator rounded after every key) and the fast mode's
"key_chain_f16_acc32" (the same steps, the accumulator f32 and never rounded), chosen by the node's
`order` attribute; the fast mode's pipeline writes the second."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kinetic.ir import numerics as nx
from kinetic.ir.numerics.floats import fma_f32, libm_f32
from kinetic.ir.ops import OPS, Op, mode_order

F32 = np.float32


def attn(order: str, n_head=1, n_kv=1, hd=64, scale=0.125):
    return SimpleNamespace(n_head=n_head, n_kv_head=n_kv, head_dim=hd, scale=scale, softcap=0.0, order=order)


def _chain_f32_accumulator(q, keys, vals, scale):
    """One head of one row over all keys, key_chain_f16_acc32 written out key by key in float32
    scalars: scores dot_f16(f16(q), k) * scale; on a new maximum ms = expf(m - s), else
    vs = expf(s - m); acc = f32(acc * ms), acc = fma(v, vs, acc); S = fma(S, ms, vs); acc * (1/S)."""
    qh = q.astype(np.float16).astype(F32)
    acc = np.zeros(q.shape[-1], F32)
    m, total = F32(-np.inf), F32(0)
    for k, v in zip(keys.astype(F32), vals.astype(F32), strict=True):
        s = F32(nx.dot_f16(qh, k) * F32(scale))
        ms, vs = F32(1), F32(1)
        if s > m:
            ms, m = libm_f32("expf", F32(m - s))[()], s
            acc = (acc * ms).astype(F32)
        else:
            vs = libm_f32("expf", F32(s - m))[()]
        acc = fma_f32(v, np.full_like(v, vs), acc).astype(F32)
        total = F32(fma_f32(np.array([total]), np.array([ms]), np.array([vs]))[0])
    return acc * (F32(1) / total)


def test_the_f32_accumulator_is_never_rounded_to_f16():
    """Equal scores (weights 1, 1, 1) over values 1, 2^-11, 2^-11: ggml's f16 accumulator loses
    both small terms (1 + 2^-11 rounds back to 1), the f32 one keeps them."""
    q = np.zeros((1, 64), F32)
    k = np.zeros((3, 64), np.float16)
    v = np.array([[1.0], [2.0 ** -11], [2.0 ** -11]], np.float16) * np.ones((3, 64), np.float16)
    seen = np.ones((1, 3), bool)
    third = F32(1) / F32(3)
    assert nx.attention_online(q, k, v, seen, attn("key_chain_f16"))[0, 0] == F32(1) * third
    assert nx.attention_online(q, k, v, seen, attn("key_chain_f16_acc32"))[0, 0] == F32(1 + 2 * 2.0 ** -11) * third


@pytest.mark.parametrize("seed", range(3))
def test_acc32_is_the_key_chain_with_an_f32_accumulator(seed):
    """On random rows (scales that make new maxima late in the chain) the reference's acc32 order
    equals the chain written out key by key in float32 scalars, bit for bit."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 60))
    q = (rng.standard_normal((1, 64)) * rng.uniform(0.5, 6)).astype(F32)
    keys = (rng.standard_normal((n, 64)) * rng.uniform(0.5, 4)).astype(np.float16)
    vals = (rng.standard_normal((n, 64)) * rng.uniform(1e-3, 4)).astype(np.float16)
    got = nx.attention_online(q, keys, vals, np.ones((1, n), bool), attn("key_chain_f16_acc32"))[0]
    want = _chain_f32_accumulator(q[0], keys, vals, 0.125)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_each_row_alone_gives_its_bits_in_a_batch():
    """Batch invariance of the acc32 reference: rows over GQA heads and a causal mask give, alone,
    the bits they give together."""
    rng = np.random.default_rng(7)
    a = attn("key_chain_f16_acc32", n_head=4, n_kv=2, hd=128)
    q = rng.standard_normal((6, 4 * 128)).astype(F32)
    keys = rng.standard_normal((9, 2 * 128)).astype(np.float16)
    vals = rng.standard_normal((9, 2 * 128)).astype(np.float16)
    visible = np.arange(9)[None, :] <= np.arange(3, 9)[:, None]
    together = nx.attention_online(q, keys, vals, visible, a)
    for r in range(6):
        assert np.array_equal(nx.attention_online(q[r: r + 1], keys, vals, visible[r: r + 1], a)[0], together[r])


def test_an_unassigned_order_is_ggmls_and_the_fast_mode_names_acc32():
    """An empty order (before the batch-invariance pass) computes ggml's order; the fast mode gives
    attention over an f16 cache "key_chain_f16_acc32" and over an f32 cache its ggml order."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 64)).astype(F32)
    keys, vals = (rng.standard_normal((20, 64)).astype(np.float16) for _ in range(2))
    seen = np.ones((2, 20), bool)
    assert np.array_equal(nx.attention_online(q, keys, vals, seen, attn("")),
                          nx.attention_online(q, keys, vals, seen, attn("key_chain_f16")))
    f16, f32 = (OPS[Op.ATTENTION].attrs(1, 1, 64, 0.125, kv_dtype=d) for d in ("f16", "f32"))
    assert mode_order(Op.ATTENTION, [], f16, "fast") == "key_chain_f16_acc32"
    assert mode_order(Op.ATTENTION, [], f16, "ggml") == "key_chain_f16"
    assert mode_order(Op.ATTENTION, [], f32, "fast") == "key_chain_f32"
