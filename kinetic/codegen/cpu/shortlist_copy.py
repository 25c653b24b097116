"""Shortlist's copies of an output layer: a smaller quantization of every row and its bounds.

Owns: `COPIES`, per original weight type how it is copied and the activations both kernels read;
`make_copy(raw, k, dtype)` -> CopyRows (the copy, each row's bound per unit of ||x||, and for the
lane copy each block's bound per unit of ||x_b||, all rounded up), `lane_values`, and `gamma`.
Q8_0 -> the blocked 4-bit lane copy (Q4_0's values, block 32, in shortlist_kernel_ir's layout, read
with the same q8_0 activations); Q6_K -> Q4_K (block 256, q8_k activations): each copy reads the
activations its original reads, so both kernels see the same x. Does not own the kernels nor how the
bound is used (shortlist.py), nor where copies are kept (shortlist_store.py); the proof is
docs/shortlist.md.

c_block = (||w_b - w'_b|| + gamma_K * (||w_b|| + ||w'_b||)) * SLACK and c_row = ||c_block|| (lane copy);
c_row = (||w - w'|| + gamma_K * (sum of the norms of the parts each kernel sums)) * SLACK (Q4_K:
the scaled values d*sc*q and the minimums dmin*m, which its kernel accumulates apart), in f64 from
the exact values the kernels read. Rows are copied in chunks (never a whole dequantized layer at
once). The lane copy is made by numba (Gemma's 262,144 rows: a few seconds, then kept on disk);
Q4_K by numpy (only synthetic files have Q6_K output layers so far).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q
from numba import njit

from kinetic.codegen.cpu.shortlist_kernel_ir import groups, pack_codes, padded_blocks

SLACK = 1.0 + 2.0**-30  # covers the f64 rounding of the bound's own arithmetic (relative 2^-53 per step)
BLOCK = 32
CHUNK_ROWS = 8192  # rows copied at a time


@dataclass(frozen=True)
class CopyRows:
    """A layer's copy and its bounds: rows u8 [N, row bytes] (the lane layout, or Q4_K rows); scales
    f16 [N, padded blocks] (lane layout) or None; c f32 [N], each row's bound per unit of ||x||;
    per_block f32 [N, K/32], each block's bound per unit of ||x_b|| (lane layout) or None."""

    rows: np.ndarray
    scales: np.ndarray | None
    c: np.ndarray
    per_block: np.ndarray | None


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
def _block_norms(scale8, q8, d16, codes, norms):
    """Per row and block, in f64 (norms [n, nb, 3]): ||w_b|| (the Q8_0 values), ||w'_b|| (the copy's
    d16 * (code - 8)) and ||w_b - w'_b||, all from the exact values the kernels read."""
    n, nb = scale8.shape
    for r in range(n):
        for b in range(nb):
            sw = 0.0
            sc = 0.0
            se = 0.0
            for i in range(BLOCK):
                w = np.float64(scale8[r, b]) * np.float64(q8[r, b, i])
                c = np.float64(d16[r, b]) * (np.float64(codes[r, b, i]) - 8.0)
                sw += w * w
                sc += c * c
                se += (w - c) * (w - c)
            norms[r, b, 0] = np.sqrt(sw)
            norms[r, b, 1] = np.sqrt(sc)
            norms[r, b, 2] = np.sqrt(se)


def _copy_rows(raw: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q8_0 rows (u8 [n, k/32*34]) -> (codes in the kernel's lane layout u8 [n, padded blocks * 16],
    scales f16 [n, padded blocks], norms f64 [n, k/32, 3], see _block_norms)."""
    n, nb = raw.shape[0], k // BLOCK
    blocks = raw.reshape(n, nb, 34)
    scale8 = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16)[:, :, 0].astype(np.float32)
    q8 = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8)
    d = np.empty((n, nb), np.float32)
    codes = np.empty((n, nb, BLOCK), np.uint8)
    _q4_codes(scale8, q8, d, codes)
    d16 = d.astype(np.float16)
    scales = np.zeros((n, padded_blocks(nb)), np.float16)
    scales[:, :nb] = d16
    norms = np.empty((n, nb, 3), np.float64)
    _block_norms(scale8, q8, d16.astype(np.float32), codes, norms)
    return pack_codes(codes), scales, norms


def _lane_copy(raw: np.ndarray, k: int) -> CopyRows:
    """The blocked 4-bit copy of Q8_0 rows (the Q4_0 rule's values, in the lane layout) and its bounds:
    per block c_b = (||w_b - w'_b|| + gamma_K (||w_b|| + ||w'_b||)) * SLACK rounded up to f32, and per
    row c = ||c_b||_2 * SLACK rounded up (so sum_b c_b ||x_b|| <= c ||x|| by Cauchy-Schwarz)."""
    parts = [_copy_rows(np.ascontiguousarray(raw[s:s + CHUNK_ROWS]), k) for s in range(0, raw.shape[0], CHUNK_ROWS)]
    norms = np.concatenate([p[2] for p in parts])
    per_block = _round_up((norms[:, :, 2] + gamma(k) * (norms[:, :, 0] + norms[:, :, 1])) * SLACK)
    per_row = _round_up(np.sqrt(np.sum(per_block.astype(np.float64) ** 2, axis=1)) * SLACK)
    return CopyRows(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), per_row, per_block)


def lane_values(copy: CopyRows, k: int) -> np.ndarray:
    """The values the lane copy stands for, f64 [N, k] (d_w * (code - 8), exact): for tests and checks."""
    n, nb = len(copy.rows), k // BLOCK
    out, start = [], 0
    for width in groups(nb):
        pairs = copy.rows[:, start * 16:(start + width) * 16].reshape(n, 4, width, 4)
        steps = np.stack([pairs & 15, pairs >> 4], axis=2).reshape(n, 8, width, 4)  # [n, step, lane, 4]
        out.append(steps.transpose(0, 2, 1, 3).reshape(n, width, BLOCK))
        start += width
    codes = np.concatenate(out, axis=1)[:, :nb].astype(np.float64) - 8.0
    return (copy.scales[:, :nb, None].astype(np.float64) * codes).reshape(n, k)


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


def _q4_k_rows(raw: np.ndarray, k: int) -> CopyRows:
    """The Q4_K copy of Q6_K rows with each row's bound c = (||w - w'|| + gamma_K (||w|| + ||scaled||
    + ||minimums||)) * SLACK rounded up (its kernel sums the two parts apart); no per-block bound."""
    parts = [_q4_k_copy(np.ascontiguousarray(raw[s:s + CHUNK_ROWS]), k) for s in range(0, raw.shape[0], CHUNK_ROWS)]
    norms = np.concatenate([p[1] for p in parts])
    c = _round_up((norms[:, 2] + gamma(k) * (norms[:, 0] + norms[:, 1] + norms[:, 3])) * SLACK)
    return CopyRows(np.concatenate([p[0] for p in parts]), None, c, None)


def _round_up(c64: np.ndarray) -> np.ndarray:
    """f64 -> the nearest f32 at or above each value."""
    c32 = c64.astype(np.float32)
    return np.where(c32.astype(np.float64) < c64, np.nextafter(c32, np.float32(np.inf)), c32)


@dataclass(frozen=True)
class Copy:
    """How one original weight type is copied: the activations both kernels read, the width a row's
    length must divide, the maker (rows, k) -> CopyRows, and the copy's GGUF type when it is scored
    by the matmul kernels (Q4_K) rather than by the lane kernel (shortlist_kernel_ir, None)."""

    original: Q
    copy: Q | None
    activations: str
    block: int
    make: Callable[[np.ndarray, int], CopyRows]


COPIES = {
    "q8_0": Copy(Q.Q8_0, None, "q8_0", 32, _lane_copy),
    "q6_k": Copy(Q.Q6_K, Q.Q4_K, "q8_k", 256, _q4_k_rows),
}


def make_copy(raw: np.ndarray, k: int, dtype: str = "q8_0") -> CopyRows:
    """The copy of a layer's rows (u8 [N, row bytes]) and its bounds, made in chunks of rows."""
    return COPIES[dtype].make(raw, k)
