"""The compiled step's attention: `attend_items`, bit for bit `numerics.attention_online`.

Owns: attention of (row, head) items over an f16 KV cache read in place, with the pass's visibility
rules (committed entries at or before the row's position, the row's ancestors in the pass, a
sliding window), as the compiled step (kinetic.codegen.cpu.step_ops) calls it for each thread's
share of the items. Every rounding step is the reference's, in its order.
"""

from __future__ import annotations

import math

import numpy as np
from numba import carray, njit

from kinetic.codegen.cpu.native import call_kernel, f16_value, fma32, i32_ptr, round_f16, u16_ptr

# numba's cache checks only this file's stamp, not those of the modules whose code it compiles in;
# this hash of them (kept current by tests/codegen/cpu/test_cpu_step.py) changes this file whenever
# they change, so a stale cache is never loaded.
SOURCES_HASH = "c2f063b871226150"

F32 = np.float32
F64 = np.float64
_ONE = F32(1)
_ZERO = F32(0)
_INF = F32(np.inf)


@njit(cache=True, inline="always", error_model="numpy")
def _score(qv, k, hd, lanes):
    """numerics.dot_f16 of q (f16 values) and a cached key row k (f16 bits). Each product of two f16
    values is exact in f32, so the reference's f64 product-plus-lane rounded to f32 is the f32 add:
    the lanes run in f32 (and vectorize); values past the last chunk of 64 add in f64 as the
    reference does."""
    main = hd - hd % 64
    total = _ZERO
    if main:
        for t in range(64):
            lanes[t] = qv[t] * f16_value(k[t])
        for c in range(64, main, 64):
            for t in range(64):
                lanes[t] += qv[c + t] * f16_value(k[c + t])
        for t in range(16):
            lanes[t] = (lanes[t] + lanes[32 + t]) + (lanes[16 + t] + lanes[48 + t])
        for t in range(8):
            lanes[t] = lanes[8 + t] + lanes[t]
        for t in range(4):
            lanes[t] = lanes[4 + t] + lanes[t]
        total = (lanes[0] + lanes[2]) + (lanes[1] + lanes[3])
    if main == hd:
        return total
    sumf = F64(total)
    for i in range(main, hd):
        sumf = sumf + F64(qv[i]) * F64(f16_value(k[i]))
    return F32(sumf)


@njit(cache=True, inline="always", error_model="numpy")
def _visible(j, n_c, cpos, mine, anc, r, pos, positions, window):
    """Whether row r (at position pos) sees cache entry j: a committed entry at or before pos, or
    one of its ancestors (or itself) among the pass rows; inside the window if there is one."""
    if j < n_c:
        p = cpos[j]
        return p <= pos and (window == 0 or p > pos - window)
    pr = mine[j - n_c]
    return pr >= 0 and anc[r, pr] != 0 and (window == 0 or positions[pr] > pos - window)


@njit(cache=True, error_model="numpy")
def attend_items(a, q, y, kp, vp, kv_width, n_head, n_kv, hd, scale, cap, window, i0, i1, step, positions,
                 row_slot, slot_rows, clen, cpos_addr, anc, score_fn, softmax_fn, heads, scale_bits, cap_bits):
    """numerics.attention_online for items i0, i0 + step, ... below i1 over an f16 cache: an item is `heads` query heads
    of one row sharing a KV head (one head where there are no generated kernels). The keys a row
    sees, in cache order; online softmax with the C library's expf; an f16 accumulator."""
    group = n_head // n_kv
    per_row = n_head // heads
    lanes = np.empty(64, np.float32)
    acc = np.empty(hd, np.float32)
    qv = np.empty(heads * hd, np.float32)
    scores = np.empty(0, np.float32)
    work = np.empty(0, np.float32)
    vis = np.empty(0, np.uint8)
    for item in range(i0, i1, step):
        r = item // per_row
        h0 = (item % per_row) * heads
        slot = row_slot[r]
        pos = positions[r]
        n_c = clen[slot]
        cpos = carray(i32_ptr(cpos_addr[slot]), (n_c + 1,))
        mine = slot_rows[slot]
        n_keys = n_c + mine.shape[0]
        keys = carray(u16_ptr(kp[slot]), (n_keys * kv_width,))
        vals = carray(u16_ptr(vp[slot]), (n_keys * kv_width,))
        ko = (h0 // group) * hd
        qo = q + r * n_head * hd + h0 * hd
        yo = y + r * n_head * hd + h0 * hd
        for i in range(heads * hd):
            qv[i] = round_f16(a[qo + i])
        first, last = n_keys, -1
        for j in range(n_keys):
            if _visible(j, n_c, cpos, mine, anc, r, pos, positions, window):
                first = min(first, j)
                last = j
        if softmax_fn != 0:
            n = max(last + 1 - first, 0)
            if vis.shape[0] < n:
                scores = np.empty(2 * n * heads, np.float32)
                work = np.empty(4 * n * heads, np.float32)
                vis = np.empty(2 * n, np.uint8)
            for j in range(first, last + 1):
                vis[j - first] = _visible(j, n_c, cpos, mine, anc, r, pos, positions, window)
            call_kernel(score_fn, qv.ctypes.data, kp[slot] + 2 * ko, scores.ctypes.data, kv_width, first, first + n, n)
            call_kernel(softmax_fn, scores.ctypes.data, vis.ctypes.data, vp[slot] + 2 * ko, a.ctypes.data + 4 * yo,
                         work.ctypes.data, kv_width, first, first + n, scale_bits, cap_bits, n)
            continue
        for g in range(heads):
            m = -_INF
            ssum = _ZERO
            for i in range(hd):
                acc[i] = _ZERO
            for j in range(first, last + 1):
                if not _visible(j, n_c, cpos, mine, anc, r, pos, positions, window):
                    continue
                base = j * kv_width + ko
                s = _score(qv[g * hd: (g + 1) * hd], keys[base: base + hd], hd, lanes) * scale
                if cap != _ZERO:
                    s = cap * F32(math.tanh(s))
                if s > m:
                    ms = F32(math.exp(m - s))
                    vs = _ONE
                    m = s
                    for i in range(hd):  # an f16 value times an f32 is exact in f64: the f32 product
                        acc[i] = round_f16(acc[i] * ms)
                else:
                    ms = _ONE
                    vs = F32(math.exp(s - m))
                v = vals[base: base + hd]
                for i in range(hd):
                    acc[i] = round_f16(fma32(f16_value(v[i]), vs, acc[i]))
                ssum = fma32(ssum, ms, vs)
            inv = _ZERO if ssum == _ZERO else _ONE / ssum
            for i in range(hd):
                a[yo + g * hd + i] = acc[i] * inv
