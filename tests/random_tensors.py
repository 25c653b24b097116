"""Random tensors stored as a GGUF file holds them, for tests that need weights of any type: f32 and
f16 as typed arrays, bf16 as uint16, quantized types as raw blocks [rows, row_bytes] whose f16 scale
fields hold small values (every other byte pattern is a valid encoding)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic.ir.quants import QUANT_TYPES

# byte offsets of each quantized layout's f16 scale fields
F16_FIELDS = {Q.Q8_0: (0,), Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.IQ4_NL: (0,), Q.Q4_K: (0, 2),
              Q.Q6_K: (208,), Q.Q5_K: (0, 2), Q.Q3_K: (108,), Q.Q2_K: (80, 82)}


def random_tensor(rng: np.random.Generator, wtype: Q, shape: tuple[int, ...]) -> np.ndarray:
    values = rng.standard_normal(shape).astype(np.float32)
    if wtype is Q.F32:
        return values
    if wtype is Q.F16:
        return values.astype(np.float16)
    if wtype is Q.BF16:
        return (values.view(np.uint32) >> 16).astype(np.uint16)
    facts = QUANT_TYPES[wtype]
    n, k = shape
    blocks = rng.integers(0, 256, (n, k // facts.block, facts.block_bytes), dtype=np.uint8)
    for offset in F16_FIELDS[wtype]:
        scales = (rng.standard_normal(blocks.shape[:2]) * 0.02).astype(np.float16)
        blocks[:, :, offset : offset + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(n, -1)
