"""GGUF tensor types: one table of every fact about a type, and the reference dequantization.

Owns: `QUANT_TYPES`, the one place a fact about a tensor type is written, which every device and
the reference read instead of typing it again: values per block, bytes per block, bits per weight,
the format activations take before a dot with weights of the type (ggml's vec_dot_type), the float
order of the type's exact dot ("lanes" or "scalar", see below), whether its blocks carry a minimum,
and the 16 values its 4-bit codes stand for. Also `dequantize`, the reference meaning of a quantized
tensor that the IR interpreter and every kernel test compare against.

The block layouts are ggml's; block sizes come from the `gguf` package's GGML_QUANT_SIZES. The
reference dequantization is `gguf.quants.dequantize`, which covers every type listed here; only
Q8_0 (d * q per block, gguf's formula) is formed here, because the compiled step reads embedding
rows each pass and gguf's per-call overhead dominated a few rows (tests/ir/test_quants.py holds it to
gguf bit for bit). `dequantize_rows` only adds a row-range view so callers never dequantize a whole
262k-row table to read a few rows.

Dot orders (docs/numerics.md, "The dot products"): "lanes" is ggml's x86 vec-dot (8 float lanes per
output, each an fma chain over the blocks, summed by hsum_float_8 at the end); "scalar" is the
repacked gemv llama.cpp runs on x86 for Q4_0, Q2_K, Q4_K, IQ4_NL and MXFP4 (one float chain of whole
block dots). None: no exact order is implemented; the reference multiplies dequantized operands.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

T = GGMLQuantizationType

# ggml-common.h kvalues_iq4nl and kvalues_mxfp4 (e2m1 values doubled); a Q4_0 nibble q stands for q - 8
IQ4NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
Q4_0_VALUES = tuple(range(-8, 8))


@dataclass(frozen=True)
class QuantType:
    """One GGUF tensor type: `block` values are stored in `block_bytes` bytes."""

    type: GGMLQuantizationType
    block: int
    block_bytes: int
    # what activation rows become before a dot with these weights: "f32", "f16", "bf16" (float
    # weights meet activations rounded to their own type), "q8_0", "q8_1" (Q8_0 plus s = d * sum q
    # per block, for Q4_1/Q5_1's minimum) or "q8_k" (blocks of 256 with sums of 16)
    activation: str = "q8_k"
    dot_order: str | None = None  # "lanes", "scalar" or None (see the module docstring)
    has_min: bool = False  # blocks carry a minimum (Q4_1/Q5_1: m; Q2_K/Q4_K/Q5_K: dmin and per-sub-block mins)
    codebook: tuple[int, ...] | None = None  # the value of each 4-bit code (IQ4_NL, IQ4_XS, MXFP4; Q4_0: q - 8)

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


def _row(t: GGMLQuantizationType, **facts) -> QuantType:
    block, block_bytes = GGML_QUANT_SIZES[t]
    return QuantType(t, block, block_bytes, **facts)


# The types Kinetic reads, highest precision first (docs/quant-types.md).
QUANT_TYPES: dict[GGMLQuantizationType, QuantType] = {
    q.type: q
    for q in (
        _row(T.F32, activation="f32"),
        _row(T.F16, activation="f16"),
        _row(T.BF16, activation="bf16"),
        _row(T.Q8_0, activation="q8_0", dot_order="lanes"),
        _row(T.Q6_K, dot_order="lanes"),
        _row(T.Q5_K, dot_order="lanes", has_min=True),
        _row(T.Q5_0, activation="q8_0", dot_order="lanes"),
        _row(T.Q5_1, activation="q8_1", dot_order="lanes", has_min=True),
        _row(T.Q4_K, dot_order="scalar", has_min=True),
        _row(T.Q4_0, activation="q8_0", dot_order="scalar", codebook=Q4_0_VALUES),
        _row(T.Q4_1, activation="q8_1", dot_order="lanes", has_min=True),
        _row(T.IQ4_NL, activation="q8_0", dot_order="scalar", codebook=IQ4NL_VALUES),
        _row(T.IQ4_XS, dot_order="lanes", codebook=IQ4NL_VALUES),
        _row(T.MXFP4, activation="q8_0", dot_order="scalar", codebook=MXFP4_VALUES),
        _row(T.Q3_K, dot_order="lanes"),
        _row(T.IQ3_S),
        _row(T.IQ3_XXS),
        _row(T.Q2_K, dot_order="scalar", has_min=True),
        _row(T.IQ2_S),
        _row(T.IQ2_XS),
        _row(T.IQ2_XXS),
        _row(T.TQ2_0),
        _row(T.IQ1_M),
        _row(T.TQ1_0),
        _row(T.IQ1_S),
    )
}
TYPES = tuple(QUANT_TYPES)


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
        q8_0 = QUANT_TYPES[T.Q8_0]
        blocks = np.ascontiguousarray(data).reshape(-1, q8_0.block_bytes)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        values = d * blocks[:, 2:].view(np.int8).astype(np.float32)
        return values.reshape(*data.shape[:-1], data.shape[-1] // q8_0.block_bytes * q8_0.block)
    return gguf_quants.dequantize(data, t).astype(np.float32, copy=False)


def dequantize_rows(data: np.ndarray, t: GGMLQuantizationType, rows: np.ndarray | slice) -> np.ndarray:
    """Dequantize only the selected rows of a 2-D tensor given as [n_rows, row_bytes] (or typed values)."""
    return dequantize(np.asarray(data[rows]), t)
