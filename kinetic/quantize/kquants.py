"""ggml's K-quant reference encoders (quantize_row_q{3,4,5,6}_K_ref), on super-blocks of 256 values.

Owns: x f32 [blocks, 256] -> the blocks' bytes [blocks, block_bytes] in ggml's layouts (block_q3_K:
hmask, qs, scales, d; block_q4_K: d, dmin, scales, qs; block_q5_K: d, dmin, scales, qh, qs;
block_q6_K: ql, qh, scales, d). Each encoder follows its C function: a scale search per sub-block
(kquant_search.py), the sub-block scales quantized to 6 or 8 bits against the block's largest, then
every value re-coded against its rounded scale. Half floats round to nearest even, as
GGML_FP32_TO_FP16 does.

Does not own the searches (kquant_search.py) or which rows get which type (mixtures.py).
"""

from __future__ import annotations

import numpy as np

from kinetic.quantize.kquant_search import (
    F32,
    GROUP_MAX_EPS,
    make_q3_quants_rmse,
    make_qkx2_quants,
    make_qx_quants_rmse1,
    nearest_int,
    signed_max,
)

QK_K = 256


def _half(v: np.ndarray) -> np.ndarray:
    """float32 values -> (their fp16 bytes [blocks, 2], the fp16 read back as float32)."""
    h = np.asarray(v, F32).astype(np.float16)
    return h.reshape(-1, 1).view(np.uint8), h.astype(F32)


def _recode(x: np.ndarray, d: np.ndarray, codes: np.ndarray, lo: int, hi: int, *, offset: np.ndarray | None = None):
    """Codes of x [groups, n] against scales d [groups]: nearest_int((x + offset) / d) clipped to
    [lo, hi]; groups whose d is 0 keep the search's codes, as C's `if (!d) continue` does."""
    with np.errstate(divide="ignore", invalid="ignore"):
        shifted = x if offset is None else x + offset[:, None]
        fresh = np.clip(nearest_int(shifted / d[:, None]), lo, hi)
    return np.where((d != 0)[:, None], fresh, codes)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    codes, scales = make_qx_quants_rmse1(x.reshape(nb * 16, 16), 32)  # codes 0..63, scales [nb*16]
    scales = scales.reshape(nb, 16)
    max_abs, max_scale = signed_max(scales)
    empty = max_abs < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = F32(-128) / max_scale
        d_bytes, d = _half(F32(1) / iscale)
        q_scales = np.minimum(127, nearest_int(iscale[:, None] * scales)).astype(np.int8)  # [nb, 16]
    sub_d = (d[:, None] * q_scales.astype(F32)).reshape(-1)
    codes = _recode(x.reshape(nb * 16, 16), sub_d, codes - 32, -32, 31) + 32
    L = codes.reshape(nb, 2, 4, 32).astype(np.uint8)  # [block, half, quarter, 32]
    low = L & 0xF
    ql = np.concatenate([low[:, :, 0] | low[:, :, 2] << 4, low[:, :, 1] | low[:, :, 3] << 4], axis=2)
    qh = (L[:, :, 0] >> 4) | (L[:, :, 1] >> 4) << 2 | (L[:, :, 2] >> 4) << 4 | (L[:, :, 3] >> 4) << 6
    out = np.concatenate([ql.reshape(nb, 128), qh.reshape(nb, 64), q_scales.view(np.uint8), d_bytes], axis=1)
    out[empty] = 0
    return out


def _pack_scales_mins(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins [nb, 8] -> the 12 scale bytes of block_q4_K/block_q5_K."""
    out = np.zeros((ls.shape[0], 12), np.uint8)
    out[:, 0:4] = ls[:, 0:4] | (ls[:, 4:8] >> 4) << 6
    out[:, 4:8] = lm[:, 0:4] | (lm[:, 4:8] >> 4) << 6
    out[:, 8:12] = (ls[:, 4:8] & 0xF) | (lm[:, 4:8] & 0xF) << 4
    return out


def _scales_mins(x: np.ndarray, nmax: int, *, rmin: float, nstep: int):
    """The shared half of Q4_K and Q5_K: codes [nb*8, 32], the packed 12 bytes, d and dmin bytes, and
    each sub-block's rounded scale and min [nb*8]."""
    nb = x.shape[0]
    groups = x.reshape(nb * 8, 32)
    sum_x2 = np.zeros(nb * 8, F32)
    for i in range(32):
        sum_x2 += groups[:, i] * groups[:, i]
    av_x = np.sqrt(sum_x2 / F32(32))
    weights = av_x[:, None] + np.abs(groups)
    codes, scales, mins = make_qkx2_quants(groups, weights, nmax, rmin=rmin, rdelta=0.1, nstep=nstep)
    scales, mins = scales.reshape(nb, 8), mins.reshape(nb, 8)
    max_scale = _running_max(scales)
    max_min = _running_max(mins)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0))
        inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0))
    ls = np.minimum(63, nearest_int(inv_scale[:, None] * scales) & 0xFF).astype(np.uint8)
    lm = np.minimum(63, nearest_int(inv_min[:, None] * mins) & 0xFF).astype(np.uint8)
    d_bytes, d = _half(max_scale / F32(63))
    dmin_bytes, dmin = _half(max_min / F32(63))
    sub_d = (d[:, None] * ls.astype(F32)).reshape(-1)
    sub_m = (dmin[:, None] * lm.astype(F32)).reshape(-1)
    head = np.concatenate([d_bytes, dmin_bytes, _pack_scales_mins(ls, lm)], axis=1)
    return groups, codes, head, sub_d, sub_m


def _running_max(v: np.ndarray) -> np.ndarray:
    """max(0, v[:, 0], v[:, 1], ...) kept as C's `if (v > m) m = v` keeps it."""
    m = np.zeros(v.shape[0], F32)
    for j in range(v.shape[1]):
        m = np.where(v[:, j] > m, v[:, j], m)
    return m


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    groups, codes, head, sub_d, sub_m = _scales_mins(x, 15, rmin=-1.0, nstep=20)
    L = _recode(groups, sub_d, codes, 0, 15, offset=sub_m).reshape(nb, 4, 2, 32).astype(np.uint8)
    qs = L[:, :, 0] | L[:, :, 1] << 4
    return np.concatenate([head, qs.reshape(nb, 128)], axis=1)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    groups, codes, head, sub_d, sub_m = _scales_mins(x, 31, rmin=-0.5, nstep=15)
    L = _recode(groups, sub_d, codes, 0, 31, offset=sub_m).reshape(nb, 4, 2, 32).astype(np.uint8)
    qs = (L[:, :, 0] & 0xF) | (L[:, :, 1] & 0xF) << 4
    shifts = (2 * np.arange(4, dtype=np.uint8))[None, :, None]
    high = ((L[:, :, 0] >> 4) << shifts) | ((L[:, :, 1] >> 4) << (shifts + 1))  # [nb, 4, 32]
    qh = np.bitwise_or.reduce(high, axis=1)
    return np.concatenate([head, qh, qs.reshape(nb, 128)], axis=1)


def quantize_q3_k(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    groups = x.reshape(nb * 16, 16)
    codes, scales = make_q3_quants_rmse(groups, 4)
    scales = scales.reshape(nb, 16)
    _, max_scale = signed_max(scales)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = F32(-32) / max_scale
        l6 = (np.clip(nearest_int(iscale[:, None] * scales), -32, 31) + 32).astype(np.uint8)  # [nb, 16]
        d_value = np.where(max_scale != 0, F32(1) / iscale, F32(0))
    l6[max_scale == 0] = 0
    d_bytes, d = _half(d_value)
    packed = np.zeros((nb, 12), np.uint8)
    packed[:, 0:8] = (l6[:, 0:8] & 0xF) | (l6[:, 8:16] & 0xF) << 4
    high = (l6 >> 4).reshape(nb, 4, 4) << (2 * np.arange(4, dtype=np.uint8))[None, :, None]  # [nb, j//4, j%4]
    packed[:, 8:12] = np.bitwise_or.reduce(high, axis=1)
    sub_d = (d[:, None] * (l6.astype(F32) - F32(32))).reshape(-1)
    L = (_recode(groups, sub_d, codes - 4, -4, 3) + 4).reshape(nb, 256).astype(np.uint8)
    hbits = (L > 3).reshape(nb, 8, 32)  # value j sets bit j // 32 of hmask byte j % 32
    hmask = np.bitwise_or.reduce(hbits.astype(np.uint8) << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)
    low = np.where(L > 3, L - 4, L).reshape(nb, 2, 4, 32)
    qs = low[:, :, 0] | low[:, :, 1] << 2 | low[:, :, 2] << 4 | low[:, :, 3] << 6
    return np.concatenate([hmask, qs.reshape(nb, 64), packed, d_bytes], axis=1)
