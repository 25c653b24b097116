"""GGUF tensor types: one table of block sizes and bits per weight, and the reference dequantization.

Owns: the facts about each tensor type the seed lists (values per block, bytes per block, bits per
weight, whether Kinetic's CPU has a direct kernel) and `dequantize`, the reference meaning of a
quantized tensor that the IR interpreter and every kernel test compare against.

The block layouts are ggml's; the numbers come from the `gguf` package's GGML_QUANT_SIZES. The
reference dequantization is `gguf.quants.dequantize`, which covers every type listed here; only
Q8_0 (d * q per block, gguf's formula) is formed here, because the compiled step reads embedding
rows each pass and gguf's per-call overhead dominated a few rows (tests/ir/test_quants.py holds it to
gguf bit for bit). `dequantize_rows` only adds a row-range view so callers never dequantize a whole
262k-row table to read a few rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

T = GGMLQuantizationType


@dataclass(frozen=True)
class QuantType:
    """One GGUF tensor type: `block` values are stored in `block_bytes` bytes."""

    type: GGMLQuantizationType
    block: int
    block_bytes: int

    @property
    def name(self) -> str:
        return self.type.name

    @property
    def bits_per_weight(self) -> float:
        return self.block_bytes * 8 / self.block

    def row_bytes(self, n_values: int) -> int:
        if n_values % self.block:
            raise ValueError(f"{self.name} rows must be a multiple of {self.block} values, not {n_values}")
        return n_values // self.block * self.block_bytes


# The types the seed lists, in its order (highest precision first).
SEED_TYPES = (
    T.F32, T.F16, T.BF16, T.Q8_0, T.Q6_K, T.Q5_K, T.Q5_0, T.Q5_1, T.Q4_K, T.Q4_0, T.Q4_1, T.IQ4_NL,
    T.IQ4_XS, T.MXFP4, T.Q3_K, T.IQ3_S, T.IQ3_XXS, T.Q2_K, T.IQ2_S, T.IQ2_XS, T.IQ2_XXS, T.TQ2_0,
    T.IQ1_M, T.TQ1_0, T.IQ1_S,
)

QUANT_TYPES: dict[GGMLQuantizationType, QuantType] = {
    t: QuantType(t, *GGML_QUANT_SIZES[t]) for t in SEED_TYPES
}


def quant_type(t: GGMLQuantizationType | str | int) -> QuantType:
    """Look a type up by enum, name ("Q4_K", case-insensitive) or GGUF code."""
    if isinstance(t, str):
        try:
            t = T[t.upper()]
        except KeyError:
            raise KeyError(f"unknown tensor type {t!r}") from None
    else:
        t = T(t)
    try:
        return QUANT_TYPES[t]
    except KeyError:
        raise KeyError(f"tensor type {t.name} is not supported") from None


def dequantize(data: np.ndarray, t: GGMLQuantizationType) -> np.ndarray:
    """Reference dequantization: raw bytes [..., row_bytes] (or typed F32/F16/BF16 values) -> float32."""
    data = np.asarray(data)
    if t == T.F32:
        return data.view(np.float32) if data.dtype == np.uint8 else data.astype(np.float32, copy=False)
    if data.dtype != np.uint8:  # typed views (float16, BF16 as uint16) go to gguf as their bytes
        data = np.ascontiguousarray(data).view(np.uint8)
    if t == T.Q8_0:  # gguf's own formula, d * q per block, without its per-call overhead (token lookups)
        blocks = np.ascontiguousarray(data).reshape(-1, 34)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        values = d * blocks[:, 2:].view(np.int8).astype(np.float32)
        return values.reshape(*data.shape[:-1], data.shape[-1] // 34 * 32)
    return gguf_quants.dequantize(data, t).astype(np.float32, copy=False)


def dequantize_rows(data: np.ndarray, t: GGMLQuantizationType, rows: np.ndarray | slice) -> np.ndarray:
    """Dequantize only the selected rows of a 2-D tensor given as [n_rows, row_bytes] (or typed values)."""
    return dequantize(np.asarray(data[rows]), t)
