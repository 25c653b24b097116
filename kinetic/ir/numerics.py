"""Reference numerics shared by the interpreter: activation quantization, matmul, norms, rotary, GELU.

These define what the ops compute, with ggml's CPU semantics where they change results beyond a
near-tie (facts read from ggml's sources, b1-0c1e570; no code copied):

* A quantized matmul first quantizes each activation row to 8 bits per block: Q8_0 (blocks of 32,
  d = amax/127 stored as f16, q = round-half-even(x * 127/amax)) for Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4
  weights; Q8_1 (Q8_0 plus s = f16(d * sum q)) for Q4_1/Q5_1, whose dot adds min * s per block;
  Q8_K (blocks of 256, iscale = -127/max with max the signed value of largest magnitude, d = 1/iscale
  kept in f32, q = min(127, round-half-even(iscale * x))) for k-quants and i-quants. F16 weights
  meet f16-rounded activations. The block dot is then exact integer arithmetic times the scales;
  here it is a float32 matmul of the dequantized operands, which differs from any blocked kernel
  only in float summation order.
* RMS norm sums squares in float64 and scales in float32.
* Rotary angles advance by repeated float32 multiplication by base^(-2/n_rot), as ggml's cache does.
* Attention is ggml's CPU flash attention for one query row: q rounded to the cache type, keys
  visited in cache order with an online softmax (running max M and sum S in f32), and, for an f16
  cache, the weighted sum of values kept in f16, rounded after every key.
* GELU is the tanh form evaluated on the f16-rounded input and rounded to f16 (ggml's table), with
  x <= -10 -> 0 and x >= 10 -> x.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic.ir.quants import dequantize

Q8_0_USERS = {Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.IQ4_NL, Q.MXFP4}
Q8_1_USERS = {Q.Q4_1, Q.Q5_1}
FLOAT_WEIGHTS = {Q.F32, Q.F16, Q.BF16}


def activation_format(wtype: Q) -> str:
    """The 8-bit format activations take before a dot with weights of type `wtype`."""
    if wtype in FLOAT_WEIGHTS:
        return wtype.name.lower()
    if wtype in Q8_0_USERS:
        return "q8_0"
    if wtype in Q8_1_USERS:
        return "q8_1"
    return "q8_k"


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
        return x.astype(np.float16).astype(np.float32)
    if fmt == "bf16":
        bits = x.astype(np.float32).view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
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


def block_minimums(raw: np.ndarray, wtype: Q) -> np.ndarray:
    """The per-block minimum m of Q4_1/Q5_1 weights [n_out, row_bytes] -> f32 [n_out, K/32]."""
    block_bytes = {Q.Q4_1: 20, Q.Q5_1: 24}[wtype]
    blocks = raw.reshape(raw.shape[0], -1, block_bytes)
    return blocks[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32)


class DequantizedWeight:
    """A weight held dequantized once (f32 [n_out, K]) plus what its matmul needs."""

    def __init__(self, raw: np.ndarray, wtype: Q):
        self.type = wtype
        self.values = dequantize(raw, wtype).reshape(raw.shape[0], -1)
        self.minimums = block_minimums(raw, wtype) if wtype in Q8_1_USERS else None


def matmul(x: np.ndarray, w: DequantizedWeight, activations: str = "q8") -> np.ndarray:
    """x f32 [rows, K] times w [n_out, K] transposed -> f32 [rows, n_out], with ggml's semantics."""
    if activations == "f32":
        return x.astype(np.float32) @ w.values.T
    fmt = activation_format(w.type)
    xq = quantized_activations(x, fmt)
    if w.minimums is None:
        return xq @ w.values.T
    # Q4_1/Q5_1: sum_b d_w d_x sum(q_w q_x) + m_w s_x, where s_x carries its own f16 rounding.
    m_expanded = np.repeat(w.minimums, 32, axis=1)
    return xq @ (w.values - m_expanded).T + q8_1_sums(x) @ w.minimums.T


def rms_norm(x: np.ndarray, eps: float, group: int = 0) -> np.ndarray:
    rows, width = x.shape
    g = group or width
    xg = x.reshape(rows, width // g, g).astype(np.float32)
    mean = (np.square(xg).astype(np.float64).sum(axis=2) / g).astype(np.float32)
    scale = (np.float32(1) / np.sqrt(mean + np.float32(eps))).astype(np.float32)
    return (xg * scale[:, :, None]).reshape(rows, width)


def rope_angles(positions: np.ndarray, n_rot: int, theta: float, freq_scale: float) -> np.ndarray:
    """f32 [rows, n_rot/2] angles: pos * freq_scale * base^(-2i/n_rot), advanced multiplicatively."""
    step = np.float32(np.power(np.float32(theta), np.float32(-2.0) / np.float32(n_rot)))
    out = np.empty((len(positions), n_rot // 2), np.float32)
    cur = positions.astype(np.float32)
    for i in range(n_rot // 2):
        out[:, i] = cur * np.float32(freq_scale)
        cur = (cur * step).astype(np.float32)
    return out


def gelu_ggml(x: np.ndarray) -> np.ndarray:
    """GELU (tanh form) as ggml's CPU evaluates it: on f16 inputs, rounded to f16, |x| >= 10 exact."""
    xh = x.astype(np.float16).astype(np.float32)
    c = np.float32(0.7978845608028654)
    inner = c * xh * (np.float32(1) + np.float32(0.044715) * xh * xh)
    y = (np.float32(0.5) * xh * (np.float32(1) + np.tanh(inner))).astype(np.float16).astype(np.float32)
    y = np.where(x <= -10, np.float32(0), y)
    return np.where(x >= 10, x, y).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    return (x / (np.float32(1) + np.exp(-x))).astype(np.float32)


def attention_online(q: np.ndarray, keys: np.ndarray, vals: np.ndarray, visible: np.ndarray, a) -> np.ndarray:
    """q f32 [rows, n_head*hd], keys/vals [n, n_kv*hd] in the cache dtype, visible bool [rows, n]."""
    rows = q.shape[0]
    nh, nkv, hd = a.n_head, a.n_kv_head, a.head_dim
    group = nh // nkv
    f16 = keys.dtype == np.float16
    qh = q.astype(keys.dtype).astype(np.float64).reshape(rows, nkv, group, hd)
    kh = keys.astype(np.float64).reshape(-1, nkv, hd)
    vh = vals.astype(np.float64).reshape(-1, nkv, hd)
    # scores for every (row, head, key) at once: f32 [rows, nkv, group, n]
    scores = (np.einsum("rkgd,nkd->rkgn", qh, kh).astype(np.float32) * np.float32(a.scale)).astype(np.float32)
    if a.softcap:
        scores = (np.float32(a.softcap) * np.tanh(scores / np.float32(a.softcap))).astype(np.float32)
    acc = np.zeros((rows, nkv, group, hd), np.float16 if f16 else np.float32)
    m = np.full((rows, nkv, group), -np.inf, np.float32)
    s_sum = np.zeros((rows, nkv, group), np.float32)
    for j in range(kh.shape[0]):
        live = visible[:, j][:, None, None]
        if not live.any():
            continue
        s = scores[:, :, :, j]
        new_max = (s > m) & live
        with np.errstate(invalid="ignore", over="ignore"):
            ms = np.where(new_max, np.exp(m - s), np.float32(1)).astype(np.float32)
            vs = np.where(new_max, np.float32(1), np.exp(s - m)).astype(np.float32)
        vs = np.where(live, vs, np.float32(0)).astype(np.float32)
        m = np.where(new_max, s, m)
        # a new maximum rescales the accumulator, which is stored (rounded) before the add
        scaled = (acc.astype(np.float64) * ms[..., None]).astype(np.float32).astype(acc.dtype)
        summed = scaled.astype(np.float64) + vh[j][None, :, None, :] * vs[..., None]
        acc = np.where(live[..., None], summed.astype(np.float32).astype(acc.dtype), acc)
        s_sum = np.where(live, (s_sum * ms + vs).astype(np.float32), s_sum)
    out = acc.astype(np.float32) / s_sum[..., None]
    return out.reshape(rows, nh * hd).astype(np.float32)
