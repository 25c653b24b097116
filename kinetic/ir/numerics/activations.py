"""Activation quantization: what an activation row becomes before a dot with quantized weights.

Owns: Q8_0 (blocks of 32, d = amax/127 stored as f16, q = round-half-even(x * 127/amax)), Q8_1
(Q8_0 plus s = f16(d * sum q) per block, for Q4_1/Q5_1's minimum) and Q8_K (blocks of 256,
iscale = -127/max with max the signed value of largest magnitude, d = 1/iscale kept in f32,
q = min(127, round-half-even(iscale * x))), and the f16 / bf16 rounding float weights meet. Which
format a weight type takes is a fact of the type (`kinetic.ir.quants.QUANT_TYPES[t].activation`).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic.ir.quants import QUANT_TYPES

Q8_0_USERS = frozenset(t for t, q in QUANT_TYPES.items() if q.activation == "q8_0")
Q8_1_USERS = frozenset(t for t, q in QUANT_TYPES.items() if q.activation == "q8_1")
FLOAT_WEIGHTS = frozenset(t for t, q in QUANT_TYPES.items() if q.activation in ("f32", "f16", "bf16"))


def activation_format(wtype: Q) -> str:
    """The format activations take before a dot with weights of type `wtype` (QUANT_TYPES; Q8_K for a
    type outside the table, as ggml's k-quant and i-quant types take)."""
    q = QUANT_TYPES.get(wtype)
    return q.activation if q is not None else "q8_k"


def quantize_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f32 [rows, K] -> (q int8 [rows, K/32, 32], d f32 [rows, K/32] holding the f16-rounded scale)."""
    rows, k = x.shape
    xb = x.reshape(rows, k // 32, 32).astype(np.float32)
    amax = np.abs(xb).max(axis=2)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[:, :, None]).astype(np.int8)
    return q, d.astype(np.float16).astype(np.float32)


def quantize_q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f32 [rows, K] -> (q int8 [rows, K/256, 256], d f32 [rows, K/256])."""
    rows, k = x.shape
    xb = x.reshape(rows, k // 256, 256).astype(np.float32)
    idx = np.abs(xb).argmax(axis=2)
    signed_max = np.take_along_axis(xb, idx[:, :, None], axis=2)[:, :, 0]
    nonzero = signed_max != 0
    with np.errstate(divide="ignore"):
        iscale = np.where(nonzero, np.float32(-127) / signed_max, np.float32(0)).astype(np.float32)
    q = np.minimum(np.rint(xb * iscale[:, :, None]), 127).astype(np.int8)
    with np.errstate(divide="ignore"):
        d = np.where(nonzero, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    return q, d


def quantized_activations(x: np.ndarray, fmt: str) -> np.ndarray:
    """The activation values a dot with weights of this format actually sees (f32 [rows, K])."""
    if fmt == "f32":
        return x.astype(np.float32)
    if fmt == "f16":
        with np.errstate(over="ignore"):  # beyond f16's range: inf, as vcvtps2ph gives
            return x.astype(np.float16).astype(np.float32)
    if fmt == "bf16":  # ggml_compute_fp32_to_bf16: round half to even, a NaN kept quiet
        bits = x.astype(np.float32).view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        rounded = np.where(np.isnan(x), (bits & 0xFFFF0000) | 0x400000, rounded).astype(np.uint32)
        return rounded.view(np.float32)
    if fmt in ("q8_0", "q8_1"):
        q, d = quantize_q8_0(x)
    else:
        q, d = quantize_q8_k(x)
    return (q.astype(np.float32) * d[:, :, None]).reshape(x.shape)


def q8_1_sums(x: np.ndarray) -> np.ndarray:
    """Q8_1's per-block s = f16(d * sum q) with d unrounded: f32 [rows, K/32]."""
    rows, k = x.shape
    xb = x.reshape(rows, k // 32, 32).astype(np.float32)
    amax = np.abs(xb).max(axis=2)
    d = (amax / np.float32(127)).astype(np.float32)
    q, _ = quantize_q8_0(x)
    s = d * q.astype(np.int32).sum(axis=2).astype(np.float32)
    return s.astype(np.float16).astype(np.float32)

