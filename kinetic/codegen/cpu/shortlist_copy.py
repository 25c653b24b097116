"""Shortlist's copies of an output layer: a smaller quantization of every row and each row's bound.

Owns: `COPIES`, per original weight type the copy's type, the activations both read and the maker;
`make_copy(raw, k, dtype)` -> (the copy's rows, c f32 [N]: each row's bound per unit of ||x||,
rounded up), and `gamma`. Q8_0 -> Q4_0 (block 32, q8_0 activations); Q6_K -> Q4_K (block 256, q8_k
activations): each copy reads the activations its original reads, so both kernels see the same x.
Does not own the kernels nor how the bound is used (shortlist.py); the proof is docs/shortlist.md.

c_row = (||w - w'|| + gamma_K * (sum of the norms of the parts each kernel sums)) * SLACK, in f64
from the exact values the kernels read: for Q8_0, Q6_K and Q4_0 the parts are the row itself; for
Q4_K the scaled values d*sc*q and the minimums dmin*m, which its kernel accumulates apart and
subtracts at the end. Rows are copied in chunks (never a whole dequantized layer at once).
Q4_0 is made by numba (Gemma's 262,144 rows: ~4 s); Q4_K by numpy (only synthetic files have Q6_K
output layers so far).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q
from numba import njit

SLACK = 1.0 + 2.0**-30  # covers the f64 rounding of the bound's own arithmetic (relative 2^-53 per step)
BLOCK = 32
CHUNK_ROWS = 8192  # rows copied at a time


def gamma(n: int) -> float:
    """Higham's gamma_n for f32: the bound on |prod (1 + d_i)^(+-1) - 1| over n roundings."""
    u = 2.0**-24
    return n * u / (1.0 - n * u)


@njit(cache=True)
def _q4_codes(scale8, q8, d, codes):
    """Per block of a Q8_0 row (scales f32 [n, nb], values i8 [n, nb, 32]): gguf's Q4_0 rule, d = the
    largest-magnitude value / -8 (f32 [n, nb]) and codes min(15, trunc(x/d + 8.5)) (u8 [n, nb, 32])."""
    n, nb = scale8.shape
    for r in range(n):
        for b in range(nb):
            biggest = np.float32(0.0)
            for i in range(BLOCK):
                v = scale8[r, b] * np.float32(q8[r, b, i])
                if abs(v) > abs(biggest):
                    biggest = v
            db = biggest / np.float32(-8.0)
            inv = np.float32(1.0) / db if db != 0 else np.float32(0.0)
            d[r, b] = db
            for i in range(BLOCK):
                v = scale8[r, b] * np.float32(q8[r, b, i])  # exact: an f16 times an int8
                codes[r, b, i] = min(15, int(v * inv + np.float32(8.5)))


@njit(cache=True)
def _row_norms(scale8, q8, d16, codes, norms):
    """Per row, in f64 (norms [n, 3]): ||w|| (the Q8_0 values), ||w'|| (the copy's d16 * (code - 8))
    and ||w - w'||, all from the exact values the kernels read."""
    n, nb = scale8.shape
    for r in range(n):
        sw = 0.0
        sc = 0.0
        se = 0.0
        for b in range(nb):
            for i in range(BLOCK):
                w = np.float64(scale8[r, b]) * np.float64(q8[r, b, i])
                c = np.float64(d16[r, b]) * (np.float64(codes[r, b, i]) - 8.0)
                sw += w * w
                sc += c * c
                se += (w - c) * (w - c)
        norms[r, 0] = np.sqrt(sw)
        norms[r, 1] = np.sqrt(sc)
        norms[r, 2] = np.sqrt(se)


def _copy_rows(raw: np.ndarray, k: int, out: np.ndarray, norms: np.ndarray) -> None:
    """Q8_0 rows (u8 [n, k/32*34]) -> Q4_0 rows in `out` (u8 [n, k/32*18], gguf's layout) and the
    rows' norms in `norms` (f64 [n, 3], see _row_norms)."""
    n, nb = raw.shape[0], k // BLOCK
    blocks = raw.reshape(n, nb, 34)
    scale8 = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16)[:, :, 0].astype(np.float32)
    q8 = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8)
    d = np.empty((n, nb), np.float32)
    codes = np.empty((n, nb, BLOCK), np.uint8)
    _q4_codes(scale8, q8, d, codes)
    d16 = d.astype(np.float16)
    copy = out.reshape(n, nb, 18)
    copy[:, :, :2] = d16[:, :, None].view(np.uint8)
    copy[:, :, 2:] = codes[:, :, :16] | (codes[:, :, 16:] << 4)
    _row_norms(scale8, q8, d16.astype(np.float32), codes, norms)


def _q4_0_copy(raw: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(the Q4_0 copy u8 [N, k/32*18] of Q8_0 rows, norms f64 [N, 3]: ||w||, ||w'||, ||w - w'||)."""
    copy = np.empty((raw.shape[0], k // BLOCK * 18), np.uint8)
    norms = np.empty((raw.shape[0], 3), np.float64)
    _copy_rows(raw, k, copy, norms)
    return copy, norms


def _q6_k_values(raw: np.ndarray, k: int) -> np.ndarray:
    """Q6_K rows (u8 [n, k/256*210]) -> their values f64 [n, k], exact (d * scale * (q - 32))."""
    n, nsb = raw.shape[0], k // 256
    blocks = raw.reshape(n * nsb, 210)
    ql, qh, scales, d = blocks[:, :128], blocks[:, 128:192], blocks[:, 192:208], blocks[:, 208:210]
    d = np.ascontiguousarray(d).view(np.float16).astype(np.float64)
    scaled = (d * scales.view(np.int8).astype(np.float64)).reshape(-1, 16, 1)
    low = (ql.reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 15
    high = (qh.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
    q = (low.reshape(-1, 2, 4, 32) | (high.reshape(-1, 2, 4, 32) << 4)).astype(np.float64) - 32
    return (scaled * q.reshape(-1, 16, 16)).reshape(n, k)


def _pack_q4_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and minimums per super-block (u8 [B, 8] each) -> ggml's 12 bytes [B, 12]."""
    out = np.empty((len(sc), 12), np.uint8)
    out[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
    return out


def _q4_k_copy(raw: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(the Q4_K copy u8 [N, k/256*144] of Q6_K rows, norms f64 [N, 4]: ||w||, ||w'||, ||w - w'||
    and the norm of the copy's minimum part; column 1 holds its scaled part's norm). Each 32-wide
    sub-block: minimum m = max(0, -min), step (max + m) / 15, both to 6 bits of the super-block's
    f16 d and dmin; codes round to nearest."""
    w = _q6_k_values(raw, k).reshape(-1, 8, 32)  # [B, 8, 32]
    low = np.maximum(0.0, -w.min(axis=2))
    step = (w.max(axis=2) + low) / 15.0
    d = (step.max(axis=1) / 63.0).astype(np.float16).astype(np.float64)
    dmin = (low.max(axis=1) / 63.0).astype(np.float16).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.nan_to_num(np.round(step / d[:, None])), 0, 63).astype(np.uint8)
        mn = np.clip(np.nan_to_num(np.round(low / dmin[:, None])), 0, 63).astype(np.uint8)
        unit = d[:, None] * sc  # [B, 8]
        base = dmin[:, None] * mn
        codes = np.clip(np.nan_to_num(np.round((w + base[:, :, None]) / unit[:, :, None])), 0, 15).astype(np.uint8)
    scaled = unit[:, :, None] * codes
    values = scaled - base[:, :, None]  # what the Q4_K kernel reads, exactly
    blocks = np.empty((len(w), 144), np.uint8)
    blocks[:, 0:2] = d.astype(np.float16).reshape(-1, 1).view(np.uint8)
    blocks[:, 2:4] = dmin.astype(np.float16).reshape(-1, 1).view(np.uint8)
    blocks[:, 4:16] = _pack_q4_k_scales(sc, mn)
    pairs = codes.reshape(-1, 4, 2, 32)
    blocks[:, 16:] = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)
    n = raw.shape[0]

    def norm(a):
        return np.sqrt(np.einsum("ri,ri->r", a.reshape(n, -1), a.reshape(n, -1)))

    mins = np.broadcast_to(base[:, :, None], w.shape)
    norms = np.stack([norm(w), norm(scaled), norm(w - values), norm(mins)], axis=1)
    return blocks.reshape(n, -1), norms


@dataclass(frozen=True)
class Copy:
    """How one original weight type is copied: the copy's type, the activations both kernels read,
    the width a row's length must divide, and the maker (rows, k) -> (copy rows, norms)."""

    original: Q
    copy: Q
    activations: str
    block: int
    make: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]


COPIES = {
    "q8_0": Copy(Q.Q8_0, Q.Q4_0, "q8_0", 32, _q4_0_copy),
    "q6_k": Copy(Q.Q6_K, Q.Q4_K, "q8_k", 256, _q4_k_copy),
}


def make_copy(raw: np.ndarray, k: int, dtype: str = "q8_0") -> tuple[np.ndarray, np.ndarray]:
    """(the copy's rows u8 [N, copy row bytes], c f32 [N]: each row's bound per unit of ||x||, rounded up)."""
    maker = COPIES[dtype].make
    parts, norms = [], []
    for start in range(0, raw.shape[0], CHUNK_ROWS):
        rows, row_norms = maker(np.ascontiguousarray(raw[start:start + CHUNK_ROWS]), k)
        parts.append(rows)
        norms.append(row_norms)
    norms = np.concatenate(norms)
    summed = norms[:, 0] + norms[:, 1] + (norms[:, 3] if norms.shape[1] > 3 else 0.0)
    c64 = (norms[:, 2] + gamma(k) * summed) * SLACK
    c32 = c64.astype(np.float32)
    c32 = np.where(c32.astype(np.float64) < c64, np.nextafter(c32, np.float32(np.inf)), c32)
    return np.concatenate(parts), c32
