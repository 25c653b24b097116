"""Layer norm as ggml's CPU computes it (ops.cpp, ggml_compute_forward_norm_f32, x86 with AVX-512F).

Owns: `layer_norm` (mean and variance of each row, no weight: BERT-style encoders multiply by the
weight and add the bias as two more ops). Does not own the weight or the bias (the graph applies them
with ggml_mul / ggml_add's roundings: reference.layer_norm and add_bias).

Per row of n values: the values summed in float64 and rounded to f32 (ggml_vec_sum_f32), mean = that
sum / n in f32; y = x - mean in f32; the squares of y, 16 lanes at a time, each chunk reduced by
_mm512_reduce_add_ps (halves 16 -> 8 -> 4, then (l0 + l2) + (l1 + l3)) and added into a float64 sum,
the last n % 16 squares (f32) added one by one in float64 (ggml_vec_cvar_f32); variance = that sum / n
rounded to f32; y * (1 / sqrtf(variance + eps)), all f32.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def _reduce_add_16(v: np.ndarray) -> np.ndarray:
    """_mm512_reduce_add_ps of f32 [..., 16] vectors: halves 16 -> 8 -> 4, then (l0+l2)+(l1+l3)."""
    v = (v[..., 8:] + v[..., :8]).astype(F32)
    v = (v[..., 4:] + v[..., :4]).astype(F32)
    return ((v[..., 0] + v[..., 2]).astype(F32) + (v[..., 1] + v[..., 3]).astype(F32)).astype(F32)


def layer_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """f32 [rows, n] -> each row minus its mean, divided by sqrt(variance + eps) (see the module)."""
    x = np.asarray(x, F32)
    rows, n = x.shape
    # one float64 chain in order from +0.0, as ggml's loop (`sum = 0.0; sum += x[i]`): adding the +0.0
    # start last changes nothing but the sign of an all-zero row's sum, which the start makes +0
    total_x = np.float64(0.0) + np.cumsum(x.astype(np.float64), axis=1)[:, -1]
    mean = (total_x.astype(F32) / F32(n)).astype(F32)  # f32 [rows]
    y = (x - mean[:, None]).astype(F32)
    main = n - n % 16
    squares = (y * y).astype(F32)
    total = np.zeros(rows, np.float64)
    for c in range(0, main, 16):  # chunk by chunk: each chunk's f32 sum joins the float64 total in order
        total = total + _reduce_add_16(squares[:, c:c + 16]).astype(np.float64)
    for i in range(main, n):
        total = total + squares[:, i].astype(np.float64)
    variance = (total / n).astype(F32)
    with np.errstate(divide="ignore"):
        scale = (F32(1) / np.sqrt((variance + F32(eps)).astype(F32))).astype(F32)
    return (y * scale[:, None]).astype(F32)
