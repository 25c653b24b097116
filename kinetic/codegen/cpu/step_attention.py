"""The compiled step's attention: `attend`, bit for bit `numerics.attention_online`.

Owns: attention over an f16 KV cache read in place, with the pass's visibility rules (committed
entries at or before the row's position, the row's ancestors in the pass, a sliding window), as the
compiled step (kinetic.codegen.cpu.step_ops) calls it for each share of the work, in two forms:

* `attend_tiles` (passes of several rows, where the tape carries a tile kernel): items are tiles
  of up to TILE_LANES (row, query head) chains, consecutive rows of one sequence times the query
  heads of one KV head (attention_tile_ir.py), each key and value row widened once per tile. The
  keys a row sees are one run [lo, hi) of the cache (found by binary search in the committed
  positions and one scan of the pass's rows) or, where they are not (a draft tree's rows), a
  per-key table the kernel also reads;
* `attend_items` (a decode step, head dims off the 64 grid): items are one row's query heads that
  share a KV head, through the one-row score and softmax kernels (attention_ir.py) or numba.

Every rounding step is the reference's, in its order, and every row's chain is computed on its
own, so a row's floats do not depend on the path, the tile or the share that computes it. Both
orders of an f16 cache: "key_chain_f16" (an f16 value accumulator) and "key_chain_f16_acc32" (an f32
one); the generated kernels are rendered for the node's order, the numba path reads `f32_acc`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import carray, njit

from kinetic.codegen.cpu.native import call_kernel, f16_value, fma32, i32_ptr, round_f16, u16_ptr

# numba's cache checks only this file's stamp, not those of the modules whose code it compiles in;
# this hash of them (kept current by tests/codegen/cpu/test_cpu_step.py) changes this file whenever
# they change, so a stale cache is never loaded.
SOURCES_HASH = "fa503fe9ef80f0bc"

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
                 row_slot, slot_rows, clen, cpos_addr, anc, score_fn, softmax_fn, heads, scale_bits, cap_bits,
                 f32_acc=False):
    """numerics.attention_online for items i0, i0 + step, ... below i1 over an f16 cache: an item is `heads` query heads
    of one row sharing a KV head (one head where there are no generated kernels). The keys a row
    sees, in cache order; online softmax with the C library's expf; an f16 accumulator (f32 where
    f32_acc: the numba path's; the generated softmax kernel is rendered for its order)."""
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
                        acc[i] = acc[i] * ms if f32_acc else round_f16(acc[i] * ms)
                else:
                    ms = _ONE
                    vs = F32(math.exp(s - m))
                v = vals[base: base + hd]
                for i in range(hd):
                    summed = fma32(f16_value(v[i]), vs, acc[i])
                    acc[i] = summed if f32_acc else round_f16(summed)
                ssum = fma32(ssum, ms, vs)
            inv = _ZERO if ssum == _ZERO else _ONE / ssum
            for i in range(hd):
                a[yo + g * hd + i] = acc[i] * inv


TILE_LANES = 16  # chains a tile kernel advances together (attention_tile_ir.LANES)


@njit(cache=True, inline="always", error_model="numpy")
def tile_heads(group):
    """The query heads of one KV head a tile holds: the most that divide the group and fit the lanes
    (the rest of the lanes hold further rows)."""
    best = 1
    for g in range(1, min(group, TILE_LANES) + 1):
        if group % g == 0:
            best = g
    return best


@njit(cache=True, inline="always", error_model="numpy")
def _count_at_most(cpos, n, value):
    """How many of the ascending cpos[:n] are <= value (binary search)."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if cpos[mid] <= value:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, error_model="numpy")
def row_span(r, n_c, cpos, ascending, mine, anc, positions, window):
    """(lo, hi, one_run): the cache entries row r sees lie in [lo, hi), and are exactly those when
    one_run (the usual case: committed positions ascending, the row's pass ancestors one run right
    after the committed entries it sees); otherwise the caller asks `_visible` key by key."""
    pos = positions[r]
    c_lo, c_hi = 0, n_c
    if ascending:
        c_hi = _count_at_most(cpos, n_c, pos)
        c_lo = 0 if window == 0 else min(_count_at_most(cpos, n_c, pos - window), c_hi)
    p_lo, p_hi, seen = 0, 0, 0
    for i in range(mine.shape[0]):
        pr = mine[i]
        if pr >= 0 and anc[r, pr] != 0 and (window == 0 or positions[pr] > pos - window):
            if seen == 0:
                p_lo = i
            p_hi = i + 1
            seen += 1
    one_run = ascending and seen == p_hi - p_lo
    if seen == 0:
        return c_lo, c_hi, one_run
    if c_hi == c_lo:
        return n_c + p_lo, n_c + p_hi, one_run
    return c_lo, n_c + p_hi, one_run and c_hi == n_c and p_lo == 0


@njit(cache=True, inline="always", error_model="numpy")
def _ascending(cpos, n):
    for j in range(1, n):
        if cpos[j] < cpos[j - 1]:
            return False
    return True


@njit(cache=True, error_model="numpy")
def _slot_tiles(slot_rows, rows_per_tile):
    """Per slot: its pass rows (slot_rows rows end in -1 padding) and the first tile of each slot in
    the pass's tile order (one more entry: the total)."""
    n_slots = slot_rows.shape[0]
    counts = np.zeros(n_slots, np.int64)
    starts = np.zeros(n_slots + 1, np.int64)
    for s in range(n_slots):
        n = 0
        while n < slot_rows.shape[1] and slot_rows[s, n] >= 0:
            n += 1
        counts[s] = n
        starts[s + 1] = starts[s] + (n + rows_per_tile - 1) // rows_per_tile
    return counts, starts


@njit(cache=True, error_model="numpy")
def attend_tiles(a, q, y, kp, vp, kv_width, n_head, n_kv, hd, window, share, shares, positions, slot_rows, clen,
                 cpos_addr, anc, tile_fn, scale_bits, cap_bits):
    """numerics.attention_online for tiles share, share + shares, ... of the pass: a tile is up to
    TILE_LANES // heads consecutive rows of one sequence times `heads` query heads of one KV head
    (tile_heads), one chain a lane of the generated tile kernel. Tiles of one row group are
    consecutive items, so shares taken in turn get rows alike (later rows of a prompt see more keys)."""
    group = n_head // n_kv
    heads = tile_heads(group)
    rows_per_tile = TILE_LANES // heads
    per_tile = n_kv * (group // heads)  # items a row group makes: KV heads times head subsets
    counts, starts = _slot_tiles(slot_rows, rows_per_tile)
    ascending = np.empty(slot_rows.shape[0], np.bool_)
    for s in range(slot_rows.shape[0]):
        n_c = clen[s]
        ascending[s] = _ascending(carray(i32_ptr(cpos_addr[s]), (n_c + 1,)), n_c)
    qt = np.zeros(TILE_LANES * hd, np.float32)
    out = np.empty(TILE_LANES * hd, np.float32)
    lo = np.zeros(TILE_LANES, np.int32)
    hi = np.zeros(TILE_LANES, np.int32)
    rows = np.empty(TILE_LANES, np.int64)
    one_run = np.empty(TILE_LANES, np.bool_)
    vis = np.empty(0, np.uint8)
    slot = 0
    for item in range(share, starts[-1] * per_tile, shares):
        tile = item // per_tile
        while tile >= starts[slot + 1]:
            slot += 1
        while tile < starts[slot]:
            slot -= 1
        kv_head = (item % per_tile) // (group // heads)
        h0 = kv_head * group + (item % (group // heads)) * heads
        n_c = clen[slot]
        cpos = carray(i32_ptr(cpos_addr[slot]), (n_c + 1,))
        mine = slot_rows[slot]
        first_row = (tile - starts[slot]) * rows_per_tile
        n_rows = min(rows_per_tile, counts[slot] - first_row)
        first, end, regular = n_c + mine.shape[0], 0, True
        for i in range(rows_per_tile):
            r = mine[first_row + i] if i < n_rows else -1
            rows[i] = r
            span_lo, span_hi, one_run[i] = 0, 0, True
            if r >= 0:
                span_lo, span_hi, one_run[i] = row_span(r, n_c, cpos, ascending[slot], mine, anc, positions, window)
                regular = regular and one_run[i]
                if span_hi > span_lo:
                    first, end = min(first, span_lo), max(end, span_hi)
            for g in range(heads):
                c = i * heads + g
                lo[c], hi[c] = span_lo, span_hi
                qo = q + r * n_head * hd + (h0 + g) * hd
                for t in range(hd):
                    qt[c * hd + t] = round_f16(a[qo + t]) if r >= 0 else _ZERO
        vis_addr = 0
        if not regular:
            if vis.shape[0] < (end - first) * TILE_LANES:
                vis = np.empty(2 * (end - first) * TILE_LANES, np.uint8)
            for i in range(rows_per_tile):
                for j in range(first, end):
                    seen = one_run[i] or _visible(j, n_c, cpos, mine, anc, rows[i], positions[rows[i]], positions,
                                                  window)
                    for g in range(heads):
                        vis[(j - first) * TILE_LANES + i * heads + g] = seen
            vis_addr = vis.ctypes.data
        first = min(first, end)
        ko = (h0 // group) * hd
        call_kernel(tile_fn, qt.ctypes.data, kp[slot] + 2 * ko, vp[slot] + 2 * ko, out.ctypes.data, lo.ctypes.data,
                    hi.ctypes.data, vis_addr, kv_width, first, end, scale_bits, cap_bits)
        for i in range(n_rows):
            yo = y + rows[i] * n_head * hd + h0 * hd
            for t in range(heads * hd):
                a[yo + t] = out[i * heads * hd + t]


@njit(cache=True, error_model="numpy")
def attend(a, q, y, kp, vp, kv_width, n_head, n_kv, hd, scale, cap, window, share, shares, rows, positions, row_slot,
           slot_rows, clen, cpos_addr, anc, score_fn, softmax_fn, heads, tile_fn, scale_bits, cap_bits, f32_acc):
    """Share `share` of `shares` of an attention op over `rows` pass rows: tiles where the tape
    carries a tile kernel and the pass has several rows, else (row, heads) items taken in turn.
    f32_acc: the order's accumulator, for the numba path (the kernels are rendered for it)."""
    if tile_fn != 0 and rows > 1:
        attend_tiles(a, q, y, kp, vp, kv_width, n_head, n_kv, hd, window, share, shares, positions, slot_rows, clen,
                     cpos_addr, anc, tile_fn, scale_bits, cap_bits)
    else:  # every shares-th item: later rows of a prompt see more keys, so contiguous shares would not balance
        attend_items(a, q, y, kp, vp, kv_width, n_head, n_kv, hd, scale, cap, window, share, rows * (n_head // heads),
                     shares, positions, row_slot, slot_rows, clen, cpos_addr, anc, score_fn, softmax_fn, heads,
                     scale_bits, cap_bits, f32_acc)
