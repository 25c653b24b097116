"""Attention of query rows over the keys they see, as ggml's CPU flash attention computes one row.

Owns: `dot_f16` (ggml_vec_dot_f16's order for scores) and `attention_online` (q rounded to the cache
type, keys in cache order with an online softmax using the C library's expf, S = fma(S, ms, vs),
out = acc * (1/S)), in the two orders of an f16 cache (kinetic/ir/orders.py): "key_chain_f16", ggml's,
whose value accumulator is f16 rounded after every key, and "key_chain_f16_acc32", the same steps
with an f32 accumulator never rounded to f16. Does not own which keys a row sees (the interpreter
passes a visibility mask), the cache, or which order a graph asks for (the batch-invariance pass).
"""

from __future__ import annotations

import numpy as np

from kinetic.ir.numerics.floats import F32, fma_f32, libm_f32


def dot_f16(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f16 (vec.cpp) on x86 with AVX-512F and no native f16 arithmetic: f16 operands
    widened to f32, 4 accumulators of 16 lanes fed by fma over chunks of 64 values, then
    acc0+acc2, acc1+acc3, their sum, and _mm512_reduce_add_ps (halves 16 -> 8 -> 4, then
    (l0+l2)+(l1+l3)); values past the last full chunk of 64 are added one by one in float64, and the
    result is rounded to f32. q [..., hd] and k [..., hd] f32 holding f16 values, broadcast; f32 [...].
    Each product of two f16 values is exact in f32, so the fma is exact in float64 then rounded."""
    hd = q.shape[-1]
    main = hd - hd % 64
    shape = np.broadcast_shapes(q.shape, k.shape)[:-1]
    acc = np.zeros(shape + (4, 16), np.float64)
    for c in range(0, main, 64):
        prod = q[..., c : c + 64].astype(np.float64) * k[..., c : c + 64].astype(np.float64)
        acc = (prod.reshape(shape + (4, 16)) + acc).astype(F32).astype(np.float64)
    a = acc.astype(F32)
    v = ((a[..., 0, :] + a[..., 2, :]).astype(F32) + (a[..., 1, :] + a[..., 3, :]).astype(F32)).astype(F32)
    v = (v[..., 8:] + v[..., :8]).astype(F32)
    v = (v[..., 4:] + v[..., :4]).astype(F32)
    total = ((v[..., 0] + v[..., 2]).astype(F32) + (v[..., 1] + v[..., 3]).astype(F32)).astype(F32)
    if main == hd:
        return total
    sumf = total.astype(np.float64)
    for i in range(main, hd):
        sumf = sumf + (q[..., i].astype(np.float64) * k[..., i].astype(np.float64))
    return sumf.astype(F32)


F32_ACCUMULATOR_ORDERS = frozenset({"key_chain_f16_acc32"})  # f16-cache orders whose accumulator stays f32


def f16_cache_accumulator(a) -> str:
    """The value accumulator over an f16 cache, "f16" (ggml's order) or "f32", by the attention
    attributes' order (empty before the batch-invariance pass: ggml's; attribute records made by hand
    for kernel tests may leave the field out, meaning the same)."""
    return "f32" if getattr(a, "order", "") in F32_ACCUMULATOR_ORDERS else "f16"


def _accumulator_dtype(keys: np.ndarray, a) -> type:
    return np.float16 if keys.dtype == np.float16 and f16_cache_accumulator(a) == "f16" else F32


def attention_online(q: np.ndarray, keys: np.ndarray, vals: np.ndarray, visible: np.ndarray, a) -> np.ndarray:
    """q f32 [rows, n_head*hd], keys/vals [n, n_kv*hd] in the cache dtype, visible bool [rows, n].

    ggml's CPU flash attention for one query row (ops.cpp, ggml_compute_forward_flash_attn_ext_f16_one_chunk):
    q rounded to the cache type; per visible key in cache order the score s = dot_f16(q, k) * scale
    (then softcap), and an online softmax: on a new maximum M the accumulator is scaled by
    ms = expf(M_old - M), else vs = expf(s - M); the accumulator += v * vs (for an f16 cache in ggml's
    order an f16 accumulator, each step an f32 fma rounded to f16; in "key_chain_f16_acc32" an f32
    accumulator, acc * ms and the fma in f32 and never rounded to f16); S = fma(S, ms, vs);
    out = acc * (1/S). expf is the C library's. Every row is computed on its own.
    """
    rows = q.shape[0]
    nh, nkv, hd = a.n_head, a.n_kv_head, a.head_dim
    group = nh // nkv
    f16 = keys.dtype == np.float16
    qh = q.astype(keys.dtype).astype(F32).reshape(rows, nkv, group, 1, hd)
    kh = keys.astype(F32).reshape(-1, nkv, hd)
    vh = vals.astype(F32).reshape(-1, nkv, hd)
    # scores f32 [rows, nkv, group, n]
    kt = kh.transpose(1, 0, 2)[:, None, :, :]  # [nkv, 1, n, hd]
    scores = np.empty((rows, nkv, group, kh.shape[0]), F32)
    for r in range(rows):
        scores[r] = dot_f16(qh[r], kt) if f16 else (qh[r].astype(np.float64) * kt).sum(-1).astype(F32)
    if a.softcap:  # ggml folds 1/softcap into the scale: s = softcap * tanhf(dot * (scale/softcap))
        scores = (scores * (F32(a.scale) / F32(a.softcap)).astype(F32)).astype(F32)
        scores = (F32(a.softcap) * libm_f32("tanhf", scores)).astype(F32)
    else:
        scores = (scores * F32(a.scale)).astype(F32)
    acc = np.zeros((rows, nkv, group, hd), _accumulator_dtype(keys, a))
    m = np.full((rows, nkv, group), -np.inf, F32)
    s_sum = np.zeros((rows, nkv, group), F32)
    for j in range(kh.shape[0]):
        live = visible[:, j][:, None, None]
        if not live.any():
            continue
        s = scores[:, :, :, j]
        new_max = (s > m) & live
        with np.errstate(invalid="ignore", over="ignore"):
            arg = np.where(new_max, m - s, s - m).astype(F32)
            e = libm_f32("expf", np.where(live, arg, F32(0)))
        ms = np.where(new_max, e, F32(1)).astype(F32)
        vs = np.where(new_max, F32(1), e).astype(F32)
        vs = np.where(live, vs, F32(0)).astype(F32)
        m = np.where(new_max, s, m)
        # a new maximum rescales the accumulator, which is stored (rounded) before the add
        scaled = (acc.astype(np.float64) * ms[..., None]).astype(F32).astype(acc.dtype)
        summed = fma_f32(vh[j][None, :, None, :], vs[..., None], scaled.astype(F32))
        acc = np.where(live[..., None], summed.astype(acc.dtype), acc)
        s_sum = np.where(live, fma_f32(s_sum, ms, vs), s_sum)
    with np.errstate(divide="ignore"):
        inv = np.where(s_sum == 0, F32(0), F32(1) / s_sum).astype(F32)
    out = (acc.astype(F32) * inv[..., None]).astype(F32)
    return out.reshape(rows, nh * hd)
