"""ggml's reference encoders of the 32-value types with 4 and 5 bits (quantize_row_q4_0_ref,
q4_1, q5_0, q5_1), on blocks x f32 [blocks, 32] -> the blocks' bytes.

Owns the exact choice of each block's extreme values, signed zeros included: Q4_0/Q5_0 take the
first value of largest magnitude (+0.0 when all are zero: C starts from max = 0.0 and only a
strictly larger magnitude replaces it); Q4_1/Q5_1 take the first minimum and maximum met in order
(C's strict `<` and `>`), so a block of -0.0 and +0.0 keeps the sign of the first zero, as its
half-float m and d then show. gguf-py's encoders take numpy's min/argmax instead, which differ from
ggml exactly there (tests/quantize/test_encoders.py, the "zeros" case); Q8_0's amax has no such
choice and stays gguf-py's.

Does not own the K-quants (kquants.py) or which tensor gets which type (mixtures.py).
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def _first_signed_max(x: np.ndarray) -> np.ndarray:
    """The first value of largest magnitude per block, +0.0 for a block of zeros."""
    index = np.abs(x).argmax(axis=1)
    value = np.take_along_axis(x, index[:, None], axis=1)[:, 0]
    return np.where(value == 0, F32(0), value)


def _first_min_max(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    vmin, vmax = x[:, 0].copy(), x[:, 0].copy()
    for i in range(1, x.shape[1]):
        vmin = np.where(x[:, i] < vmin, x[:, i], vmin)
        vmax = np.where(x[:, i] > vmax, x[:, i], vmax)
    return vmin, vmax


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d != 0, F32(1) / d, F32(0))


def _half_bytes(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _nibbles(q: np.ndarray) -> np.ndarray:
    """Codes [blocks, 32] -> 16 bytes: value j in the low nibble of byte j, value j+16 in the high."""
    return (q[:, :16] & 0xF) | (q[:, 16:] & 0xF) << 4


def _high_bits(q: np.ndarray) -> np.ndarray:
    """Bit 4 of each of 32 codes -> 4 bytes (a little-endian uint32, value j at bit j)."""
    return np.packbits((q >> 4) & 1, axis=1, bitorder="little")


def _symmetric(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 (levels 16) and Q5_0 (32): d = max / -(levels/2), codes trunc(x/d + levels/2 + 0.5)."""
    d = _first_signed_max(x) / F32(-(levels // 2))
    shifted = x * _inverse(d)[:, None] + F32(levels // 2 + 0.5)
    q = np.minimum(levels - 1, shifted.astype(np.int32).astype(np.int8)).astype(np.uint8)
    return d, q


def _asymmetric(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1 (16) and Q5_1 (32): d = (max - min) / (levels-1), codes trunc((x - min)/d + 0.5)."""
    vmin, vmax = _first_min_max(x)
    d = (vmax - vmin) / F32(levels - 1)
    shifted = (x - vmin[:, None]) * _inverse(d)[:, None] + F32(0.5)
    q = shifted.astype(np.int32).astype(np.uint8)
    return d, vmin, np.minimum(levels - 1, q) if levels == 16 else q


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    d, q = _symmetric(x, 16)
    return np.concatenate([_half_bytes(d), _nibbles(q)], axis=1)


def quantize_q5_0(x: np.ndarray) -> np.ndarray:
    d, q = _symmetric(x, 32)
    return np.concatenate([_half_bytes(d), _high_bits(q), _nibbles(q)], axis=1)


def quantize_q4_1(x: np.ndarray) -> np.ndarray:
    d, vmin, q = _asymmetric(x, 16)
    return np.concatenate([_half_bytes(d), _half_bytes(vmin), _nibbles(q)], axis=1)


def quantize_q5_1(x: np.ndarray) -> np.ndarray:
    d, vmin, q = _asymmetric(x, 32)
    return np.concatenate([_half_bytes(d), _half_bytes(vmin), _high_bits(q), _nibbles(q)], axis=1)
