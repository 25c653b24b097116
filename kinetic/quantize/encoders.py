"""Rows of float32 values -> rows of a tensor type's bytes, as ggml_quantize_chunk writes them
without an importance matrix.

Owns: `ENCODERS` (type -> encoder of f32 [rows, ncols] into uint8 [rows, row_bytes]) and
`to_float` (an input tensor's rows as float32, as llama-quantize's dequantization gives them).
Q8_0 and BF16 are gguf-py's encoders (gguf-py tests them bit for bit against ggml's reference
quantizers, and tests/quantize/test_encoders.py does again); Q4_0, Q4_1, Q5_0 and Q5_1 are
legacy.py (gguf-py's differ from ggml on blocks of signed zeros); F16 is numpy's round to nearest
even, as ggml_fp32_to_fp16_row; the K-quants are kquants.py.

Does not own the choice of types (mixtures.py) or the file (gguf_out.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

from kinetic.ir.quants import dequantize
from kinetic.quantize import kquants, legacy

T = GGMLQuantizationType
Encoder = Callable[[np.ndarray], np.ndarray]
READABLE = (T.F32, T.F16, T.BF16, T.Q8_0)  # the input types whose values the encoders start from


def _per_block(encode_blocks: Callable[[np.ndarray], np.ndarray], qtype: GGMLQuantizationType) -> Encoder:
    """An encoder of rows from one of blocks: f32 [rows, ncols] -> uint8 [rows, row_bytes]."""
    block, block_bytes = GGML_QUANT_SIZES[qtype]

    def encode(rows: np.ndarray) -> np.ndarray:
        n_rows, ncols = rows.shape
        blocks = np.ascontiguousarray(rows, dtype=np.float32).reshape(-1, block)
        return encode_blocks(blocks).reshape(n_rows, ncols // block * block_bytes)

    return encode


def _gguf(qtype: GGMLQuantizationType) -> Encoder:
    """gguf-py's encoder for qtype: f32 [rows, ncols] -> uint8 [rows, row_bytes]."""

    def encode(rows: np.ndarray) -> np.ndarray:
        return gguf_quants.quantize(np.ascontiguousarray(rows, dtype=np.float32), qtype)

    return encode


def _f16(rows: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rows, dtype=np.float32).astype(np.float16).view(np.uint8)


def _f32(rows: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rows, dtype=np.float32).view(np.uint8)


ENCODERS: dict[GGMLQuantizationType, Encoder] = {
    T.F32: _f32,
    T.F16: _f16,
    T.BF16: _gguf(T.BF16),
    T.Q8_0: _gguf(T.Q8_0),
    T.Q5_1: _per_block(legacy.quantize_q5_1, T.Q5_1),
    T.Q5_0: _per_block(legacy.quantize_q5_0, T.Q5_0),
    T.Q4_1: _per_block(legacy.quantize_q4_1, T.Q4_1),
    T.Q4_0: _per_block(legacy.quantize_q4_0, T.Q4_0),
    T.Q6_K: _per_block(kquants.quantize_q6_k, T.Q6_K),
    T.Q5_K: _per_block(kquants.quantize_q5_k, T.Q5_K),
    T.Q4_K: _per_block(kquants.quantize_q4_k, T.Q4_K),
    T.Q3_K: _per_block(kquants.quantize_q3_k, T.Q3_K),
}


def to_float(data: np.ndarray, qtype: GGMLQuantizationType, ncols: int) -> np.ndarray:
    """An input tensor's rows (raw bytes or typed values) as f32 [rows, ncols]. Every readable type
    converts exactly (F16, BF16 widen; Q8_0's d*q is one exact product), so any order of operations
    gives llama-quantize's floats."""
    return dequantize(np.asarray(data), qtype).reshape(-1, ncols)
