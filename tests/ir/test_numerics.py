"""The op semantics pinned to ggml's CPU backend (kinetic/ir/numerics.py, docs/numerics.md).

Small hand-computed cases: activation quantization with its rounding ties, the Q8_1 correction of
Q4_1 dots, the block-32 accumulation order, the GELU table and its cut-offs, the f16 online softmax,
rotary angles and the fused rotation, ggml's vectorized exp.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kinetic.ir import numerics as nx

F32 = np.float32


def f16(x):
    return np.float16(x).astype(F32)


# -- activation quantization ---------------------------------------------------------------------


def test_q8_0_scale_and_round_half_even():
    # amax = 127 -> d = 1, id = 1: the values themselves are rounded, halves to even
    x = np.zeros((1, 32), F32)
    x[0, :8] = [127, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.4999]
    q, d = nx.quantize_q8_0(x)
    assert d.tolist() == [[1.0]]
    assert q[0, 0, :8].tolist() == [127, 0, 2, 2, 0, -2, -2, 3]


def test_q8_0_scale_is_rounded_to_f16_but_quantizes_with_the_exact_inverse():
    x = np.zeros((1, 32), F32)
    x[0, 0], x[0, 1] = 1.0, 0.5
    q, d = nx.quantize_q8_0(x)
    assert d[0, 0] == f16(F32(1) / F32(127))  # stored scale: f16(amax/127)
    assert q[0, 0, 0] == 127 and q[0, 0, 1] == 64  # 63.5 rounds to even
    assert nx.quantize_q8_0(np.zeros((1, 32), F32))[0].tolist() == [[[0] * 32]]


def test_q8_k_uses_the_signed_maximum_and_an_f32_scale():
    x = np.zeros((1, 256), F32)
    x[0, 0], x[0, 1], x[0, 2], x[0, 3] = -127, 63.5, 62.5, 127  # the first largest magnitude is negative
    q, d = nx.quantize_q8_k(x)
    assert d[0, 0] == F32(1)  # 1 / (-127 / -127)
    assert q[0, 0, :4].tolist() == [-127, 64, 62, 127]
    x[0, 0] = 127  # positive maximum: iscale = -1, so the quants flip sign and d = -1
    q, d = nx.quantize_q8_k(x)
    assert d[0, 0] == F32(-1)
    assert q[0, 0, :4].tolist() == [-127, -64, -62, -127]


def test_activation_formats():
    assert nx.activation_format(Q.Q4_1) == "q8_1"
    assert nx.activation_format(Q.Q5_0) == "q8_0"
    assert nx.activation_format(Q.Q4_K) == "q8_k"
    assert nx.activation_format(Q.F16) == "f16"


# -- quantized dots ------------------------------------------------------------------------------


def q4_1_block(d: float, m: float, q: list[int]) -> np.ndarray:
    raw = np.zeros(20, np.uint8)
    raw[0:2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
    raw[2:4] = np.frombuffer(np.float16(m).tobytes(), np.uint8)
    for j in range(16):
        raw[4 + j] = q[j] | (q[j + 16] << 4)
    return raw


def test_q4_1_dot_adds_the_minimum_times_the_f16_block_sum():
    qw = [j % 16 for j in range(32)]
    w = nx.DequantizedWeight(q4_1_block(1.0, 0.5, qw).reshape(1, 20), Q.Q4_1)
    x = np.zeros((1, 32), F32)
    x[0, :4] = [127, -3, 2, 1]  # d_x = 1
    x[0, 5] = 0.3  # quantizes to 0
    out = nx.matmul(x, w)
    qx = [127, -3, 2, 1] + [0] * 28
    s = f16(sum(qx))  # s = f16(d_x * sum q_x), here exact
    assert out[0, 0] == F32(sum(a * b for a, b in zip(qw, qx, strict=True)) + 0.5 * s)
    # the float path ignores all of it
    assert nx.matmul(x, w, "f32")[0, 0] == pytest.approx(float(x[0] @ w.values[0]), rel=1e-6)


def test_q8_1_sum_uses_the_unrounded_scale():
    x = np.zeros((1, 32), F32)
    x[0, 0], x[0, 1] = 1.0, 1.0
    s = nx.q8_1_sums(x)
    d = F32(1) / F32(127)
    assert s[0, 0] == f16(d * F32(254))


def test_block32_dot_accumulates_lanes_in_ggml_order():
    # one Q8_0 row of two blocks; every lane sum is exact, the float order is ggml's
    rng = np.random.default_rng(0)
    raw = np.zeros((1, 68), np.uint8)
    qw = rng.integers(-127, 128, size=(2, 32)).astype(np.int8)
    dw = [0.0123, 0.456]
    for b in range(2):
        raw[0, 34 * b : 34 * b + 2] = np.frombuffer(np.float16(dw[b]).tobytes(), np.uint8)
        raw[0, 34 * b + 2 : 34 * b + 34] = qw[b].view(np.uint8)
    w = nx.DequantizedWeight(raw, Q.Q8_0)
    x = rng.standard_normal((1, 64)).astype(F32)
    qx, dx = nx.quantize_q8_0(x)
    acc = np.zeros(8, F32)
    for b in range(2):
        lanes = (qw[b].astype(np.int64) * qx[0, b]).reshape(8, 4).sum(1).astype(F32)
        dd = F32(f16(dw[b]) * dx[0, b])
        acc = np.array([nx.fma_f32(dd, lanes[i], acc[i]) for i in range(8)], F32)
    half = (acc[4:] + acc[:4]).astype(F32)
    expect = F32(F32(half[0] + half[2]) + F32(half[1] + half[3]))
    assert nx.matmul(x, w)[0, 0] == expect


def test_matmul_rows_do_not_depend_on_each_other():
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, size=(5, 20 * 2), dtype=np.uint8)
    for b in range(2):  # sane f16 scales and minimums
        raw[:, 20 * b : 20 * b + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        raw[:, 20 * b + 2 : 20 * b + 4] = np.frombuffer(np.float16(-0.05).tobytes(), np.uint8)
    w = nx.DequantizedWeight(raw, Q.Q4_1)
    x = rng.standard_normal((3, 64)).astype(F32)
    together = nx.matmul(x, w)
    for r in range(3):
        assert np.array_equal(nx.matmul(x[r : r + 1], w)[0], together[r])


# -- GELU, SiLU ----------------------------------------------------------------------------------


def test_gelu_cutoffs_at_plus_minus_ten():
    x = np.array([-12.0, -10.0, 10.0, 12.3, -9.99, 9.99], F32)
    y = nx.gelu_ggml(x)
    assert y[0] == 0 and y[1] == 0  # x <= -10 -> 0
    assert y[2] == F32(10.0) and y[3] == F32(12.3)  # x >= 10 -> x itself, not rounded to f16
    assert y[5] == f16(9.99)  # inside: the f16 table entry of f16(x)
    assert y[4] == F32(0) or abs(y[4]) < 1e-20  # gelu(-9.99) underflows in f16


def test_gelu_is_the_f16_table():
    y = nx.gelu_ggml(np.array([0.0, 1.0, -1.0, 1.0001], F32))
    assert y[0] == 0
    assert y[1] == f16(0.8411919906082768)
    assert y[2] == f16(-0.15880800939172324)
    assert y[3] == y[1]  # 1.0001 is 1.0 in f16


def test_ggml_expf_is_within_a_few_ulp_and_saturates():
    x = np.linspace(-80, 80, 20001).astype(F32)
    y = nx.expf_ggml(x)
    ref = np.exp(x.astype(np.float64))
    ulp = np.spacing(ref.astype(F32)).astype(np.float64)
    assert np.all(np.abs(y - ref) <= 2.5 * ulp)  # ggml: 1.45 ulp + 0.5 ulp rounding
    big = nx.expf_ggml(np.array([-200.0, 200.0], F32))
    assert big[0] == 0 and np.isinf(big[1])


def test_silu():
    y = nx.silu(np.array([0.0, 20.0, -20.0, 1.0], F32))
    assert y[0] == 0 and y[1] == F32(20.0)
    assert abs(y[2]) < 1e-7
    assert y[3] == pytest.approx(1 / (1 + np.exp(-1)), rel=1e-6)


# -- attention -----------------------------------------------------------------------------------


def attn(n_head=1, n_kv=1, hd=64, scale=0.125):
    return SimpleNamespace(n_head=n_head, n_kv_head=n_kv, head_dim=hd, scale=scale, softcap=0.0)


def test_online_softmax_one_key_returns_the_value():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 64)).astype(F32)
    k = rng.standard_normal((1, 64)).astype(np.float16)
    v = rng.standard_normal((1, 64)).astype(np.float16)
    out = nx.attention_online(q, k, v, np.ones((1, 1), bool), attn())
    assert np.array_equal(out[0], v[0].astype(F32))


def test_online_softmax_equal_scores_sum_in_f16():
    q = np.zeros((1, 64), F32)  # all scores 0: weights 1, 1, 1
    k = np.zeros((3, 64), np.float16)
    v = np.array([[1.0], [2.0 ** -11], [2.0 ** -11]], np.float16) * np.ones((3, 64), np.float16)
    out = nx.attention_online(q, k, v, np.ones((1, 3), bool), attn())
    # f16 accumulator: 1 + 2^-11 rounds back to 1 (half ulp, ties to even) twice; then / 3 as * (1/3)
    assert out[0, 0] == F32(1) * (F32(1) / F32(3))
    plain = (1 + 2 * 2.0 ** -11) / 3  # a float softmax keeps the small terms
    assert out[0, 0] != F32(plain)


def test_online_softmax_matches_a_plain_softmax_to_f16_precision():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 2 * 64)).astype(F32)
    k = rng.standard_normal((5, 64)).astype(np.float16)
    v = rng.standard_normal((5, 64)).astype(np.float16)
    visible = np.tril(np.ones((2, 5), bool), 3)
    out = nx.attention_online(q, k, v, visible, attn(n_head=2))
    qh = q.astype(np.float16).astype(np.float64).reshape(2, 2, 64)
    s = np.einsum("rhd,nd->rhn", qh, k.astype(np.float64)) * 0.125
    s = np.where(visible[:, None, :], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ref = np.einsum("rhn,nd->rhd", p, v.astype(np.float64)).reshape(2, 128)
    np.testing.assert_allclose(out, ref, atol=4e-3)
    # rows are independent: each row alone gives the same bits
    for r in range(2):
        alone = nx.attention_online(q[r : r + 1], k, v, visible[r : r + 1], attn(n_head=2))
        assert np.array_equal(alone[0], out[r])


def test_f16_dot_order():
    q = np.zeros((1, 64), F32)
    k = np.zeros((1, 64), F32)
    q[0, 0], k[0, 0] = 1.0, 2.0 ** 24  # lane 0 of accumulator 0
    q[0, 1], k[0, 1] = 1.0, 1.0  # lane 1 of accumulator 0
    q[0, 32], k[0, 32] = 1.0, 1.0  # lane 0 of accumulator 2, added to lane 0 first
    # (2^24 + 1) rounds to 2^24 in f32, then + 1 again rounds away: 2^24
    assert nx.dot_f16(q, k)[0] == F32(2.0 ** 24)
    assert float(q[0] @ k[0].astype(np.float64)) == 2.0 ** 24 + 2


# -- rotary --------------------------------------------------------------------------------------


def test_rope_angles_advance_by_float32_products_of_powf():
    step = nx.powf(10000.0, -2.0 / 64)
    assert step == F32(np.power(10000.0, -2 / 64))  # glibc powf is correctly rounded here
    ang = nx.rope_angles(np.array([0, 3]), nx.Rotary(64, 10000.0))
    assert ang.shape == (2, 32)
    assert np.all(ang[0] == 0)
    expect, cur = [], F32(3)
    for _ in range(32):
        expect.append(cur)
        cur = F32(cur * step)
    assert ang[1].tolist() == expect


def test_rope_rotation_is_fused():
    cos, sin = nx.rope_cos_sin(np.array([0]), nx.Rotary(4, 10000.0))
    assert cos.tolist() == [[1, 1]] and sin.tolist() == [[0, 0]]
    x0 = np.array([1 + 2.0 ** -23], F32)
    x1 = np.array([1.0], F32)
    c, s = np.array([1 - 2.0 ** -24], F32), np.array([1 - 2.0 ** -24], F32)
    y0, y1 = nx.rope_rotate(x0, x1, c, s)
    # fma(x0, c, -(x1*s)) keeps the exact product x0*c; unfused it would round x0*c first
    exact = (1 + 2.0 ** -23) * (1 - 2.0 ** -24) - float(F32(1 - 2.0 ** -24))
    assert y0[0] == F32(exact)
    assert y0[0] != F32(F32(x0[0] * c[0]) - F32(x1[0] * s[0]))


@pytest.mark.parametrize("wtype,block_bytes,d_at", [(Q.Q4_K, 144, (0, 2)), (Q.Q6_K, 210, (208,))])
def test_superblock_dots_equal_the_float_product_up_to_rounding(wtype, block_bytes, d_at):
    rng = np.random.default_rng(4)
    raw = rng.integers(0, 256, size=(6, 2 * block_bytes), dtype=np.uint8)
    for b in range(2):  # sane f16 scales
        for off in d_at:
            raw[:, b * block_bytes + off : b * block_bytes + off + 2] = np.frombuffer(
                np.float16(0.003).tobytes(), np.uint8)
    w = nx.DequantizedWeight(raw, wtype)
    x = rng.standard_normal((3, 512)).astype(F32)
    got = nx.matmul(x, w)
    ref = nx.quantized_activations(x, "q8_k").astype(np.float64) @ w.values.T.astype(np.float64)
    scale = np.abs(nx.quantized_activations(x, "q8_k")) @ np.abs(w.values).T
    assert np.all(np.abs(got - ref) <= 1e-6 * scale + 1e-6)
    for r in range(3):  # each row alone gives the same bits
        assert np.array_equal(nx.matmul(x[r : r + 1], w)[0], got[r])


def test_fma_f32_is_a_true_fma():
    """fma_f32 rounds a*b + c once, as the hardware fma does (checked against llvm.fma through numba),
    including sums whose float64 value is exactly an f32 midpoint with a nonzero remainder: there a
    float64 product-plus-add rounds to even and a true fma does not."""
    from numba import njit

    from kinetic.codegen.cpu.native import fma32

    @njit
    def hardware(a, b, c, out):
        for i in range(a.size):
            out[i] = fma32(a[i], b[i], c[i])

    rng = np.random.default_rng(21)
    n = 200_000
    a = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(F32)
    b = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(F32)
    c = (rng.standard_normal(n) * np.exp2(rng.integers(-60, 20, n))).astype(F32)
    k = np.arange(-30, 30)
    ta = (F32(1 + 2**-12) * np.exp2(k)).astype(F32)  # ta * tb is an f32 midpoint
    tb = np.full(k.size, F32(1 + 2**-12))
    tc = np.exp2(k - 60.0).astype(F32)  # far below the float64 precision of the product
    a, b, c = (np.concatenate(x) for x in ([a, ta, ta, -ta], [b, tb, tb, tb], [c, tc, -tc, tc]))
    want = np.empty_like(a)
    hardware(a, b, c, want)
    got = nx.fma_f32(a, b, c)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    naive = (a.astype(np.float64) * b + c).astype(F32)
    assert (naive.view(np.uint32) != want.view(np.uint32)).sum() >= 60  # the ties are really exercised
