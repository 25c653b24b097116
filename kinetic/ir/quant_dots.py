"""The integer side of the quantized dot products for Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS, MXFP4 and Q4_0
(ggml's orders), and of Q8_0, Q5_0, Q4_1 and Q5_1 in the fast order ("block_chain", kinetic/ir/orders.py).

Owns: reading these weight types' block layouts (ggml-common.h; gguf.quants decodes the same bytes to
the same values, tests/ir/test_quant_dots.py holds them together) into the exact integer weights
that the x86 kernels llama.cpp runs for a decode row multiply with the int8 activations, grouped
the way those kernels group them, plus each block's float scales. `numerics.matmul` owns the float
steps (fma order, horizontal sums) that turn them into results; nothing here rounds.

Two groupings, after ggml's kernels (ggml/src/ggml-cpu/arch/x86/quants.c and repack.cpp):

* "lanes" (ggml_vec_dot_q3_K_q8_K, ggml_vec_dot_q5_K_q8_K, ggml_vec_dot_iq4_xs_q8_K): per
  super-block of 256, 8 int32 lanes; lane l sums, over the 8 chunks c of 32 values, the values
  32c+4l .. 32c+4l+3 times their sub-block scale. These types are not repacked on x86.
* "scalar" (ggml_gemv_q2_K_8x8_q8_K, ggml_gemv_iq4_nl_8x8_q8_0, ggml_gemv_mxfp4_8x8_q8_0: llama.cpp
  repacks these types on AVX2 / AVX-512 machines, ggml-cpu/repack.cpp
  ggml_repack_get_optimal_repack_type): one int32 per output column and block, the whole block's
  scaled sum.

A weight is `IntegerParts`: `weights[n, b, lane, pos]` (float32 holding small integers, sub-block
scale folded in) against the block's activations permuted by `perm`, so that every lane sum is one
exact product; Q2_K and Q5_K add their minimums through the Q8_K sums of 16 (`mins`), Q4_1 and Q5_1
through their float minimum `m` against Q8_1's block sums. The fast order's types (CHAIN_TYPES:
Q8_0 q, Q5_0 q - 16, Q4_1 and Q5_1 q unsigned) are one lane of 32 per block, in block order; their
ggml order is numerics/weights.py's lane layout, so they are decoded here only when asked for. Q3_K,
Q5_K and IQ4_XS in the fast order read the same "lanes" parts, summed per super-block
(SUPERBLOCK_CHAIN_TYPES; numerics.dots._parts_chain).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic.ir.quants import QUANT_TYPES

F32 = np.float32

# the value of each 4-bit code (QUANT_TYPES' codebooks), as arrays to index with the codes
IQ4NL_VALUES = np.array(QUANT_TYPES[Q.IQ4_NL].codebook, np.int8)
MXFP4_VALUES = np.array(QUANT_TYPES[Q.MXFP4].codebook, np.int8)
Q4_0_VALUES = np.array(QUANT_TYPES[Q.Q4_0].codebook, np.int8)  # a Q4_0 nibble q stands for q - 8

# lane l of a super-block: positions 32c + 4l + i for chunks c = 0..7, i = 0..3 (the 8 int32 lanes of
# maddubs + madd, or vpdpbusd, accumulated over a super-block's 8 chunks of 32)
LANE_PERM = np.array([32 * c + 4 * lane + i for lane in range(8) for c in range(8) for i in range(4)])


@dataclass(frozen=True)
class IntegerParts:
    """One weight [n, K] as ggml's dot kernel splits it (see the module docstring)."""

    wtype: Q
    weights: np.ndarray  # f32 [n, nb, lanes, block/lanes] integers, sub-block scales folded in
    perm: np.ndarray  # int [block]: block position of each (lane, pos), flattened
    d: np.ndarray  # f32 [n, nb]: the block's float scale
    mins: np.ndarray | None = None  # f32 [n, nb, 16]: integer minimum per 16 activations
    dmin: np.ndarray | None = None  # f32 [n, nb]
    m: np.ndarray | None = None  # f32 [n, nb]: Q4_1/Q5_1's float minimum, added to every value of the block

    @property
    def order(self) -> str:
        """The float order (QUANT_TYPES): "lanes" (8 lanes per super-block, hsum_float_8 at the end) or "scalar"."""
        return QUANT_TYPES[self.wtype].dot_order

    @property
    def block(self) -> int:
        """Values per block: 32 (Q8_0 activations) or 256 (Q8_K)."""
        return QUANT_TYPES[self.wtype].block


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    return blocks[:, :, at : at + 2].copy().view(np.float16)[:, :, 0].astype(F32)


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """Q2_K/Q3_K low bits: [..., 64 bytes] -> [..., 256] with value 128h + 32s + l = bits 2s of byte 32h + l."""
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)
    q = (qs.reshape(*qs.shape[:2], 2, 1, 32) >> shifts) & np.uint8(3)
    return q.reshape(*qs.shape[:2], 256)


def _nibbles32(qs: np.ndarray) -> np.ndarray:
    """Block-32 nibble order: [..., 16 bytes] -> [..., 32], value j < 16 the low nibble of byte j, j + 16 its high."""
    return np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=-1)


def _k4_scale_min(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes -> 8 six-bit scales and 8 mins (get_scale_min_k4)."""
    sc = sc.astype(np.int32)
    low, mid, top = sc[..., 0:4], sc[..., 4:8], sc[..., 8:12]
    scales = np.concatenate([low & 63, (top & 15) | ((low >> 6) << 4)], axis=-1)
    mins = np.concatenate([mid & 63, (top >> 4) | ((mid >> 6) << 4)], axis=-1)
    return scales, mins


def _lanes(values: np.ndarray) -> np.ndarray:
    """[n, nb, 256] in block order -> [n, nb, 8, 32] lane-major (LANE_PERM)."""
    return values[:, :, LANE_PERM].reshape(*values.shape[:2], 8, 32).astype(F32)


def _q2_k(blocks: np.ndarray) -> IntegerParts:
    # block_q2_K: scales[16] (low nibble scale, high nibble min, per 16 values), qs[64], d, dmin
    q = _crumbs(blocks[:, :, 16:80]).astype(np.int32)
    sc = (blocks[:, :, 0:16] & np.uint8(15)).astype(np.int32)
    mins = (blocks[:, :, 0:16] >> np.uint8(4)).astype(F32)
    w = (q * np.repeat(sc, 16, axis=2)).astype(F32)[:, :, None, :]
    return IntegerParts(Q.Q2_K, w, np.arange(256), _f16(blocks, 80), mins, _f16(blocks, 82))


def _q3_k(blocks: np.ndarray) -> IntegerParts:
    # block_q3_K: hmask[32], qs[64], scales[12] (16 six-bit scales, offset 32), d
    low = _crumbs(blocks[:, :, 32:96]).astype(np.int32)
    hmask = blocks[:, :, 0:32].astype(np.int32)  # bit 4h + s of byte l: value 128h + 32s + l
    high = (hmask[:, :, None, :] >> np.arange(8).reshape(1, 1, 8, 1)) & 1
    q = low + 4 * high.reshape(*low.shape) - 4  # -4 .. 3: ggml subtracts 4 where the high bit is clear
    raw = blocks[:, :, 96:108].astype(np.int32)
    j = np.arange(16)
    sc = ((raw[:, :, j % 8] >> (4 * (j // 8))) & 15) | (((raw[:, :, 8 + j % 4] >> (2 * (j // 4))) & 3) << 4)
    w = q * np.repeat(sc - 32, 16, axis=2)
    return IntegerParts(Q.Q3_K, _lanes(w), LANE_PERM, _f16(blocks, 108))


def _q5_k(blocks: np.ndarray) -> IntegerParts:
    # block_q5_K: d, dmin, scales[12], qh[32], qs[128]; chunk c = 2p + h: nibble h of qs[32p + l], bit c of qh[l]
    qs = blocks[:, :, 48:176].reshape(*blocks.shape[:2], 4, 1, 32)
    nib = (qs >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)) & np.uint8(15)
    qh = blocks[:, :, 16:48].astype(np.int32)
    high = (qh[:, :, None, :] >> np.arange(8).reshape(1, 1, 8, 1)) & 1
    q = nib.reshape(*blocks.shape[:2], 8, 32).astype(np.int32) + 16 * high
    sc, mn = _k4_scale_min(blocks[:, :, 4:16])
    w = (q * sc[:, :, :, None]).reshape(*blocks.shape[:2], 256)
    mins16 = np.repeat(mn, 2, axis=2).astype(F32)  # min j against the Q8_K sums 2j and 2j + 1
    return IntegerParts(Q.Q5_K, _lanes(w), LANE_PERM, _f16(blocks, 0), mins16, _f16(blocks, 2))


def _iq4_xs(blocks: np.ndarray) -> IntegerParts:
    # block_iq4_xs: d, scales_h (u16, 2 bits per sub-block), scales_l[4] (4 bits per sub-block), qs[128]
    nib = _nibbles32(blocks[:, :, 8:136].reshape(*blocks.shape[:2], 8, 16))
    q = IQ4NL_VALUES[nib].astype(np.int32)  # [n, nb, 8, 32]
    ib = np.arange(8)
    sh = blocks[:, :, 2:4].copy().view(np.uint16)[:, :, 0].astype(np.int32)
    sl = blocks[:, :, 4:8].astype(np.int32)
    ls = ((sl[:, :, ib // 2] >> (4 * (ib % 2))) & 15) | (((sh[:, :, None] >> (2 * ib)) & 3) << 4)
    w = (q * (ls - 32)[:, :, :, None]).reshape(*blocks.shape[:2], 256)
    return IntegerParts(Q.IQ4_XS, _lanes(w), LANE_PERM, _f16(blocks, 0))


def _iq4_nl(blocks: np.ndarray) -> IntegerParts:
    w = IQ4NL_VALUES[_nibbles32(blocks[:, :, 2:18])].astype(F32)[:, :, None, :]
    return IntegerParts(Q.IQ4_NL, w, np.arange(32), _f16(blocks, 0))


def _q4_0(blocks: np.ndarray) -> IntegerParts:
    # x86 llama.cpp repacks Q4_0 (N a multiple of 8) and runs ggml_gemv_q4_0_8x8_q8_0: IQ4_NL's order
    w = Q4_0_VALUES[_nibbles32(blocks[:, :, 2:18])].astype(F32)[:, :, None, :]
    return IntegerParts(Q.Q4_0, w, np.arange(32), _f16(blocks, 0))


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """ggml_e8m0_to_fp32_half (ggml-impl.h; x86 reads it from a table of the same values): 2^(e - 128),
    the two smallest as float32 subnormals."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23)).astype(np.uint32)
    return bits.view(F32)


def _mxfp4(blocks: np.ndarray) -> IntegerParts:
    w = MXFP4_VALUES[_nibbles32(blocks[:, :, 1:17])].astype(F32)[:, :, None, :]
    return IntegerParts(Q.MXFP4, w, np.arange(32), e8m0_half(blocks[:, :, 0]))


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's qh[4] (a little-endian u32) -> [..., 32]: value j's fifth bit, bit j of qh."""
    word = qh.copy().view(np.uint32)  # [..., 1]
    return ((word >> np.arange(32, dtype=np.uint32)) & np.uint32(1)).astype(np.int32)


def _chain(wtype: Q, q: np.ndarray, d: np.ndarray, m: np.ndarray | None = None) -> IntegerParts:
    return IntegerParts(wtype, q.astype(F32)[:, :, None, :], np.arange(32), d, m=m)


def _q8_0(blocks: np.ndarray) -> IntegerParts:
    # block_q8_0: d, qs[32] (int8)
    return _chain(Q.Q8_0, blocks[:, :, 2:34].copy().view(np.int8), _f16(blocks, 0))


def _q5_0(blocks: np.ndarray) -> IntegerParts:
    # block_q5_0: d, qh[4], qs[16]; value j = nibble j | bit j of qh << 4, minus 16
    q = _nibbles32(blocks[:, :, 6:22]).astype(np.int32) | (_high_bits(blocks[:, :, 2:6]) << 4)
    return _chain(Q.Q5_0, q - 16, _f16(blocks, 0))


def _q4_1(blocks: np.ndarray) -> IntegerParts:
    # block_q4_1: d, m, qs[16]; value j = d * nibble j + m
    return _chain(Q.Q4_1, _nibbles32(blocks[:, :, 4:20]), _f16(blocks, 0), _f16(blocks, 2))


def _q5_1(blocks: np.ndarray) -> IntegerParts:
    # block_q5_1: d, m, qh[4], qs[16]; value j = d * (nibble j | bit j of qh << 4) + m
    q = _nibbles32(blocks[:, :, 8:24]).astype(np.int32) | (_high_bits(blocks[:, :, 4:8]) << 4)
    return _chain(Q.Q5_1, q, _f16(blocks, 0), _f16(blocks, 2))


_DECODERS = {Q.Q4_0: _q4_0, Q.Q2_K: _q2_k, Q.Q3_K: _q3_k, Q.Q5_K: _q5_k, Q.IQ4_XS: _iq4_xs, Q.IQ4_NL: _iq4_nl,
             Q.MXFP4: _mxfp4}
TYPES = frozenset(_DECODERS)
# block-32 types whose ggml order is "lanes" but which the fast order sums as one chain of whole
# blocks (kinetic/ir/orders.py "block_chain"): decoded here for that order only
_CHAIN_DECODERS = {Q.Q8_0: _q8_0, Q.Q5_0: _q5_0, Q.Q4_1: _q4_1, Q.Q5_1: _q5_1}
CHAIN_TYPES = frozenset(_CHAIN_DECODERS)
# K-quant types whose ggml order is "lanes" and whose fast order ("block_chain") sums each super-block's
# lanes as exact integers first: one fma per super-block (Q6_K's parts are numerics/weights.py's)
SUPERBLOCK_CHAIN_TYPES = frozenset({Q.Q3_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS})
# the types of each order decoded here (Q4_K and Q6_K have their own parts: numerics/weights.py)
LANE_ORDER = frozenset(t for t in TYPES if QUANT_TYPES[t].dot_order == "lanes")
SCALAR_ORDER = frozenset(t for t in TYPES if QUANT_TYPES[t].dot_order == "scalar")


def integer_parts(raw: np.ndarray, wtype: Q) -> IntegerParts:
    """Raw blocks u8 [n, row_bytes] of one of TYPES or CHAIN_TYPES -> their IntegerParts."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    blocks = raw.reshape(raw.shape[0], -1, QUANT_TYPES[wtype].block_bytes)
    return (_DECODERS.get(wtype) or _CHAIN_DECODERS[wtype])(blocks)


def values(parts: IntegerParts) -> np.ndarray:
    """The dequantized weight f32 [n, K] these parts stand for (d * weights - dmin * mins + m), in block
    order: what gguf's dequantization gives, up to float rounding; a check on the layouts."""
    n, nb = parts.d.shape
    w = np.empty((n, nb, parts.block), np.float64)
    w[:, :, parts.perm] = parts.weights.reshape(n, nb, parts.block)
    out = w * parts.d[:, :, None]
    if parts.mins is not None:
        out -= np.repeat(parts.mins, parts.block // 16, axis=2) * parts.dmin[:, :, None]
    if parts.m is not None:
        out += parts.m[:, :, None]
    return out.reshape(n, nb * parts.block)
