"""The fast order "block_chain" on the K-quants whose ggml order is "lanes8" (Q6_K, Q5_K, Q3_K, IQ4_XS;
kinetic/ir/numerics/dots.py): it is its definition, one float32 fma per super-block of its exact
integer dot (Q5_K also a chain of its minimums, subtracted at the end), computed here by a slow scalar
loop on bytes decoded by hand from ggml-common.h's layouts; a row gives the same bits alone as among
others; it is another order than ggml's."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kinetic.ir import numerics
from kinetic.ir.quants import QUANT_TYPES
from tests.ir.test_fast_order import same_bits

F32 = np.float32
KQUANTS = [Q.Q6_K, Q.Q5_K, Q.Q3_K, Q.IQ4_XS]
ids = [t.name for t in KQUANTS]
# where each type's f16 scales lie in its block (d, and Q5_K's dmin)
F16_AT = {Q.Q6_K: (208,), Q.Q5_K: (0, 2), Q.Q3_K: (108,), Q.IQ4_XS: (0,)}
IQ4_VALUES = QUANT_TYPES[Q.IQ4_NL].codebook


def random_raw(rng: np.random.Generator, wtype: Q, n: int, k: int, scales=None) -> np.ndarray:
    """u8 [n, row_bytes]: random bytes with f16 scales drawn from `scales` (default N(0, 0.02))."""
    blocks = rng.integers(0, 256, (n, k // 256, QUANT_TYPES[wtype].block_bytes), dtype=np.uint8)
    for off in F16_AT[wtype]:
        d = (rng.standard_normal(blocks.shape[:2]) * 0.02) if scales is None else rng.choice(scales, blocks.shape[:2])
        blocks[:, :, off : off + 2] = d.astype(np.float16).view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(n, -1)


def _f16(b: np.ndarray, at: int) -> F32:
    return F32(b[at : at + 2].copy().view(np.float16)[0])


def _k4(sc: np.ndarray, j: int) -> tuple[int, int]:
    """get_scale_min_k4: sub-block j's six-bit scale and minimum."""
    sc = [int(v) for v in sc]
    if j < 4:
        return sc[j] & 63, sc[j + 4] & 63
    return (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)


def _super_block(wtype: Q, b: np.ndarray):
    """(q[256], scale of each value, d, per-sub-block minimums or None, dmin) of one super-block."""
    if wtype is Q.Q6_K:
        q, s = [], []
        for i in range(256):
            h, t, lo = i // 128, (i % 128) // 32, i % 32
            ql = (int(b[64 * h + lo + 32 * (t % 2)]) >> (4 * (t // 2))) & 15
            qh = (int(b[128 + 32 * h + lo]) >> (2 * t)) & 3
            q.append((ql | qh << 4) - 32)
            s.append(int(b[192 + i // 16 : 193 + i // 16].view(np.int8)[0]))
        return q, s, _f16(b, 208), None, None
    if wtype is Q.Q5_K:
        q, s = [], []
        for i in range(256):
            j = i // 32  # sub-block: nibble j % 2 of qs[32 (j // 2) + l], bit j of qh[l]
            nib = (int(b[48 + 32 * (j // 2) + i % 32]) >> (4 * (j % 2))) & 15
            q.append(nib + 16 * ((int(b[16 + i % 32]) >> j) & 1))
            s.append(_k4(b[4:16], j)[0])
        return q, s, _f16(b, 0), [_k4(b[4:16], j)[1] for j in range(8)], _f16(b, 2)
    if wtype is Q.Q3_K:
        q, s = [], []
        for i in range(256):
            h, t, lo = i // 128, (i % 128) // 32, i % 32
            low = (int(b[32 + 32 * h + lo]) >> (2 * t)) & 3
            high = (int(b[lo]) >> (4 * h + t)) & 1
            q.append(low - (0 if high else 4))
            j = i // 16
            sc = ((int(b[96 + j % 8]) >> (4 * (j // 8))) & 15) | (((int(b[104 + j % 4]) >> (2 * (j // 4))) & 3) << 4)
            s.append(sc - 32)
        return q, s, _f16(b, 108), None, None
    q, s = [], []
    scales_h = int(b[2]) | int(b[3]) << 8
    for i in range(256):
        ib, j = i // 32, i % 32
        q.append(IQ4_VALUES[(int(b[8 + 16 * ib + j % 16]) >> (4 * (j // 16))) & 15])
        s.append((((int(b[4 + ib // 2]) >> (4 * (ib % 2))) & 15) | (((scales_h >> (2 * ib)) & 3) << 4)) - 32)
    return q, s, _f16(b, 0), None, None


def slow_block_chain(x: np.ndarray, raw: np.ndarray, wtype: Q) -> np.ndarray:
    """The definition, one output at a time: per super-block isum = sum_i sc_i q_i x_i (exact),
    acc = fma(f32(isum), f32(d_w * d_x), acc); Q5_K imin = sum_j min_j * (sum of sub-block j's x),
    accm = fma(f32(imin), f32(dmin_w * d_x), accm) and y = f32(acc - accm); else y = acc."""
    qx, dx = numerics.quantize_q8_k(x)
    bytes_per = QUANT_TYPES[wtype].block_bytes
    out = np.empty((x.shape[0], raw.shape[0]), F32)
    for n in range(raw.shape[0]):
        blocks = [_super_block(wtype, raw[n, b * bytes_per : (b + 1) * bytes_per]) for b in range(x.shape[1] // 256)]
        for r in range(x.shape[0]):
            acc, accm = F32(0), F32(0)
            for b, (q, s, d, mins, dmin) in enumerate(blocks):
                xs = [int(v) for v in qx[r, b]]
                isum = sum(si * qi * xi for si, qi, xi in zip(s, q, xs, strict=True))
                acc = numerics.fma_f32(F32(isum), F32(d * dx[r, b]), acc)
                if mins is not None:
                    imin = sum(mins[j] * sum(xs[32 * j : 32 * j + 32]) for j in range(8))
                    accm = numerics.fma_f32(F32(imin), F32(dmin * dx[r, b]), accm)
            out[r, n] = F32(acc - accm) if wtype is Q.Q5_K else acc
    return out


@pytest.mark.parametrize("k", [256, 768])
@pytest.mark.parametrize("wtype", KQUANTS, ids=ids)
def test_block_chain_is_its_definition_on_random_blocks(wtype, k):
    """numerics.matmul(order="block_chain") equals the scalar loop of its definition bit for bit on
    random weights and activations."""
    rng = np.random.default_rng([21, int(wtype), k])
    raw = random_raw(rng, wtype, 5, k)
    x = rng.standard_normal((3, k)).astype(F32)
    got = numerics.matmul(x, numerics.DequantizedWeight(raw, wtype), order="block_chain")
    assert same_bits(got, slow_block_chain(x, raw, wtype))


@pytest.mark.parametrize("wtype", KQUANTS, ids=ids)
def test_block_chain_is_its_definition_on_extreme_blocks(wtype):
    """The same on super-blocks at the edges: every quant bit set or clear, f16 scales at the largest
    finite, subnormal, zero and negative zero, and rows that underflow or overflow in the products."""
    rng = np.random.default_rng([22, int(wtype)])
    edges = np.array([65504.0, -65504.0, 6e-8, -6e-8, 0.0, -0.0, 1.0, -2.5])
    raw = random_raw(rng, wtype, 6, 512, scales=edges)
    raw[0, :] = 0xFF
    raw[1, :] = 0x00
    x = rng.standard_normal((5, 512)).astype(F32)
    x[0] = 0
    x[1] *= F32(1e-30)
    x[2] *= F32(1e33)
    x[3] = np.where(np.arange(512) % 2 == 0, F32(1.5), F32(-1.5))
    with np.errstate(all="ignore"):
        got = numerics.matmul(x, numerics.DequantizedWeight(raw, wtype), order="block_chain")
        want = slow_block_chain(x, raw, wtype)
    assert same_bits(got, want)


@pytest.mark.parametrize("wtype", KQUANTS, ids=ids)
def test_a_row_gives_the_same_bits_alone_as_among_others(wtype):
    """Each of 37 rows (more than one chunk of the reference's rows) gives alone what it gives in the
    batch: the chain is per row."""
    rng = np.random.default_rng([23, int(wtype)])
    raw = random_raw(rng, wtype, 9, 512)
    x = rng.standard_normal((37, 512)).astype(F32)
    w = numerics.DequantizedWeight(raw, wtype)
    batch = numerics.matmul(x, w, order="block_chain")
    for r in (0, 15, 16, 36):
        assert same_bits(numerics.matmul(x[r : r + 1], w, order="block_chain")[0], batch[r])


@pytest.mark.parametrize("wtype", KQUANTS, ids=ids)
def test_the_fast_order_is_another_order_than_ggmls(wtype):
    """On these types "block_chain" is not ggml's 8-lane order: some output differs in its last bits,
    while both stay the same dot to rounding."""
    rng = np.random.default_rng([24, int(wtype)])
    raw = random_raw(rng, wtype, 64, 2048)
    x = rng.standard_normal((4, 2048)).astype(F32)
    w = numerics.DequantizedWeight(raw, wtype)
    fast, ggml = numerics.matmul(x, w, order="block_chain"), numerics.matmul(x, w)
    assert not same_bits(fast, ggml)
    assert np.allclose(fast, ggml, rtol=1e-4, atol=1e-4 * np.abs(ggml).max())
