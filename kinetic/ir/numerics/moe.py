"""Mixture-of-experts routing numerics, as ggml's CPU ops compute them (llama.cpp's build_moe_ffn).

Owns the arithmetic of a router row: the gate (ggml_soft_max: max, then ggml_v_expf over blocks of
16 lanes each reduced by _mm512_reduce_add_ps into a double, the tail by libm expf, then one multiply
by the float of 1/sum; or ggml_sigmoid: 1 / (1 + expf(-x))), the choice of experts
(ggml_argsort_top_k: a descending sort, the first k; ties go to the lower expert, where std::sort
leaves them unspecified), the routing weights (ggml_get_rows of the gate's values, ggml_sum_rows in
a double, ggml_clamp at F16's smallest normal, ggml_div, ggml_scale) and the weighted sum of the
experts' outputs (ggml_mul by the weight, then the slots added in order). Every function works row
by row: a row's values never depend on the other rows. Does not own the experts' matmuls (dots.py).
"""

from __future__ import annotations

import numpy as np

from kinetic.ir.numerics.floats import F32, libm_f32
from kinetic.ir.numerics.pointwise import expf_ggml

GATINGS = ("softmax", "sigmoid")
WEIGHT_SUM_FLOOR = F32(6.103515625e-5)  # llama.cpp clamps the weights' sum here (F16's smallest normal)


def _reduce_add_16(v: np.ndarray) -> np.ndarray:
    """_mm512_reduce_add_ps of f32 [..., 16]: halves 16 -> 8 -> 4, then (l0 + l2) + (l1 + l3)."""
    h8 = (v[..., 8:] + v[..., :8]).astype(F32)
    h4 = (h8[..., 4:] + h8[..., :4]).astype(F32)
    return ((h4[..., 0] + h4[..., 2]).astype(F32) + (h4[..., 1] + h4[..., 3]).astype(F32)).astype(F32)


def softmax_rows(x: np.ndarray) -> np.ndarray:
    """ggml_soft_max of each row of f32 [rows, n] (no mask, scale 1)."""
    x = np.asarray(x, F32)
    shifted = (x - x.max(axis=1, keepdims=True)).astype(F32)
    n_blocked = x.shape[1] // 16 * 16
    e = np.empty_like(shifted)
    e[:, :n_blocked] = expf_ggml(shifted[:, :n_blocked])
    e[:, n_blocked:] = libm_f32("expf", shifted[:, n_blocked:])
    total = np.zeros(x.shape[0], np.float64)
    for lo in range(0, n_blocked, 16):
        total += _reduce_add_16(e[:, lo:lo + 16]).astype(np.float64)
    for i in range(n_blocked, x.shape[1]):
        total += e[:, i].astype(np.float64)
    return (e * (1.0 / total).astype(F32)[:, None]).astype(F32)


def sigmoid_rows(x: np.ndarray) -> np.ndarray:
    """ggml_sigmoid: 1 / (1 + expf(-x)) in float32, libm's expf."""
    x = np.asarray(x, F32)
    with np.errstate(over="ignore"):
        return (F32(1) / (F32(1) + libm_f32("expf", (F32(0) - x).astype(F32)))).astype(F32)


def gate(logits: np.ndarray, gating: str) -> np.ndarray:
    """The router's probabilities f32 [rows, n_expert] from its logits."""
    return softmax_rows(logits) if gating == "softmax" else sigmoid_rows(logits)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """i32 [rows, k]: each row's k highest-scoring experts, highest first (ties: the lower index)."""
    order = np.argsort(-np.asarray(scores, F32), axis=1, kind="stable")
    return order[:, :k].astype(np.int32)


def route_weights(probs: np.ndarray, ids: np.ndarray, *, normalize: bool, scale: float) -> np.ndarray:
    """f32 [rows, k]: the chosen experts' probabilities, divided by their sum (in a double, clamped)
    when `normalize`, times `scale` unless it is 0 or 1 (llama.cpp's test)."""
    w = np.take_along_axis(np.asarray(probs, F32), ids.astype(np.int64), axis=1)
    if normalize:
        total = np.zeros(w.shape[0], np.float64)
        for j in range(w.shape[1]):
            total += w[:, j].astype(np.float64)
        w = (w / np.maximum(total.astype(F32), WEIGHT_SUM_FLOOR)[:, None]).astype(F32)
    if scale not in (0.0, 1.0):
        w = (w * F32(scale)).astype(F32)
    return w


def weighted_sum(outputs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """f32 [rows, width] from the experts' outputs f32 [rows, k * width] and their weights f32
    [rows, k]: each slot times its weight, then slot 0 + slot 1 + ... in order."""
    rows, k = weights.shape
    slots = (np.asarray(outputs, F32).reshape(rows, k, -1) * weights[:, :, None]).astype(F32)
    total = slots[:, 0]
    for j in range(1, k):
        total = (total + slots[:, j]).astype(F32)
    return np.ascontiguousarray(total, F32)
