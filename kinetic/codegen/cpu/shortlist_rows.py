"""Shortlist's choice of rows from the copy's scores: the best ones, and those whose bound reaches the floor.

Owns: `summarize` (run by the scan's threads on each chunk of rows they have just scored: per group of
GROUP rows the largest copy score), `group_bounds` (per group the largest row constant c, once per
layer), `best_rows` and `rows_reaching`, which use those maxima to pass over whole groups that
cannot hold a wanted row (the block bound step prefetching its scattered reads: native.prefetch).
Does not own the bound's constants (shortlist_copy.py), the scan (shortlist_scan.py) or the floor
(shortlist.py).

Skipping a group changes no answer: a group is passed over only when its maxima show that every
row in it fails the very test the row itself would be put to (the same f64 expression, `_upper`,
whose rounding is monotonic in the score and in c), and a group holding a NaN or -inf copy score
(rows that are never skipped) gets an infinite maximum.
So both functions return exactly what a row-by-row pass returns; they read 1/GROUP of the rows'
scores and bounds where Gemma's greedy floor leaves most groups behind.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kinetic.codegen.cpu.native import prefetch
from kinetic.codegen.cpu.shortlist_copy import SLACK

# numba's cache checks only this file's stamp, not those of the modules whose code or constants it
# compiles in (SLACK, native.prefetch); this hash of them (kept current by
# tests/codegen/cpu/test_shortlist_cache_keys.py) changes this file whenever they change, so a stale
# cache is never loaded.
SOURCES_HASH = "53829d46777fdb25"

GROUP = 32  # rows per group (divides shortlist_scan.CHUNK_ROWS, so a chunk holds whole groups)
AHEAD = 8  # candidate rows whose block bounds are prefetched ahead of the one tested (_block_bound_keeps)


def group_count(n: int) -> int:
    return -(-n // GROUP)


@njit(inline="always")
def _upper(ai, ci, scale, extra):
    """A row's upper bound in f64 from its copy score and row constant (`rows_reaching`'s first test).
    IEEE rounding is monotonic, so a larger ai or ci never gives a smaller result."""
    return ai + (np.float64(ci) * scale + extra)


NEVER_SKIPPED = np.int32(2**31 - 1)  # a group key: the group holds a NaN or -inf copy score
NEG_INF_BITS = np.int32(-8388608)  # 0xFF800000, -inf's bits as an i32
ABS_BITS = np.int32(2**31 - 1)


@njit(inline="always")
def _key(bits):
    """An f32's bits (i32) -> an i32 that orders as the floats do (-0 just below +0); NaN and -inf ->
    NEVER_SKIPPED."""
    special = (bits & ABS_BITS) > np.int32(0x7F800000) or bits == NEG_INF_BITS
    return NEVER_SKIPPED if special else bits ^ ((bits >> 31) & ABS_BITS)


@njit(cache=True)
def group_maxima(keys):
    """Group keys -> the largest copy score of each group, f64 (+inf for NEVER_SKIPPED)."""
    bits = np.empty(keys.size, np.int32)
    for g in range(keys.size):
        bits[g] = keys[g] ^ ((keys[g] >> 31) & ABS_BITS)
    out = bits.view(np.float32).astype(np.float64)
    for g in range(keys.size):
        if keys[g] == NEVER_SKIPPED:
            out[g] = np.inf
    return out


@njit(nogil=True, cache=True)
def summarize(a, n0, n1, keys):
    """For each group in rows [n0, n1) of the copy's scores a (n0 a multiple of GROUP): its largest
    score's key (_key), NEVER_SKIPPED where it holds a row kept whatever its bound (NaN or -inf a).
    Integer maxima: the loop is vectorized, which float maxima (NaN rules) are not."""
    bits = a.view(np.int32)
    for g in range(n0 // GROUP, (n1 + GROUP - 1) // GROUP):
        top = np.int32(-(2**31))
        for i in range(g * GROUP, min((g + 1) * GROUP, n1)):
            top = max(top, _key(bits[i]))
        keys[g] = top


def group_bounds(c: np.ndarray) -> np.ndarray:
    """Each group's largest row constant c, f32 [groups] (rows past the end count as 0)."""
    padded = np.zeros(group_count(len(c)) * GROUP, np.float32)
    padded[:len(c)] = c
    return padded.reshape(-1, GROUP).max(axis=1)


@njit(cache=True)
def best_rows(a, m, keys):
    """Indices of the m largest entries of a (any m of them on ties), by a running sorted buffer; a
    group whose largest entry (keys, from summarize) cannot enter a full buffer is passed over."""
    vals = np.full(m, -np.inf, np.float32)
    idx = np.full(m, -1, np.int64)
    maxima = group_maxima(keys)
    for g in range(keys.size):
        if idx[0] >= 0 and maxima[g] <= vals[0]:  # every v in it has v <= vals[0]: none would enter
            continue
        for i in range(g * GROUP, min((g + 1) * GROUP, a.shape[0])):
            v = a[i]
            if v > vals[0] or idx[0] < 0:
                j = 0
                while j + 1 < m and (v > vals[j + 1] or idx[j + 1] < 0):
                    vals[j] = vals[j + 1]
                    idx[j] = idx[j + 1]
                    j += 1
                vals[j] = v
                idx[j] = i
    return idx[idx >= 0]


def rows_reaching(a, c, xnorm, floor, tiny, per_block, xblocks, keys, cmax, known):
    """Indices i, not in `known` (sorted i64), whose upper bound reaches floor: first a[i] + (c[i] *
    xnorm + tiny) * SLACK (the row's bound; a group is passed over when that bound at its largest
    score (keys, from summarize) and largest c (cmax) is below), then, where there are per-block
    bounds (per_block [N, B], xblocks [B]), a[i] + (sum_b per_block[i, b] * xblocks[b] + tiny) * SLACK
    (the block bound, never larger). An upper bound u (f64) is below floor when u < floor - 2^-40
    |floor|: that margin covers u's own rounding (relative 2^-52) whatever its sign. NaN and -inf
    copy scores are kept, never skipped.

    Why in three steps, each without a branch on the data: the rows visited lie scattered over the
    layer's scores and bounds, so their reads wait on memory; a loop whose next reads do not hang on
    a branch taken one way or the other keeps many in flight (Gemma 3 greedy, CPU time under load:
    0.7-0.85 ms a token before, 0.5-0.6 after), and the block bound step prefetches its candidates'
    block bounds AHEAD rows ahead, which keeps more than numpy's gather of them did (benchmarks/
    shortlist_exact.py: rows_reaching 0.83-0.89x its CPU time, Gemma 3 decode from BOS).
    Why not a tighter group test (the largest of the group's own row bounds, computed by the scan's
    threads once ||x|| is known): it visited 2,100 groups instead of 4,900 but its f64 maxima cost the
    scan more than they saved here."""
    scale, extra = xnorm * SLACK, tiny * SLACK
    low = floor - abs(floor) * 2.0**-40
    rows = _row_bound_rows(a, c, scale, extra, low, keys, cmax)  # i64, ascending
    if per_block.shape[1]:
        rows = rows[_block_bound_keeps(a, rows, per_block, xblocks, extra, low, AHEAD)]
    return _without(rows, known)


@njit(cache=True)
def _row_bound_rows(a, c, scale, extra, low, keys, cmax):
    """The rows whose row bound _upper(a, c, scale, extra) reaches low, or whose score is NaN or -inf,
    in ascending order: the groups whose bound at their largest score and c reaches it listed first
    (so is every row's below it otherwise: none is kept), then their rows."""
    maxima = group_maxima(keys)
    groups = np.empty(keys.size, np.int64)
    count = 0
    for g in range(keys.size):
        groups[count] = g
        count += np.int64(not (_upper(maxima[g], cmax[g], scale, extra) < low))
    out = np.empty(count * GROUP, np.int64)
    n = 0
    for j in range(count):
        for i in range(groups[j] * GROUP, min((groups[j] + 1) * GROUP, a.shape[0])):
            ai = np.float64(a[i])
            out[n] = i
            n += np.int64(not (_upper(ai, c[i], scale, extra) < low) or ai == -np.inf)
    return out[:n]


@njit(cache=True)
def _block_bound_keeps(a, rows, per_block, xblocks, extra, low, ahead):
    """For each of `rows`: whether its block bound a + (sum_b per_block[row, b] * xblocks[b] + extra) *
    SLACK reaches low (NaN and -inf a: kept). The rows lie scattered over per_block (f32 [N, B]): the
    block bounds of the row `ahead` places on are prefetched, so `ahead` rows' misses are in flight."""
    keep = np.empty(rows.size, np.bool_)
    base = per_block.ctypes.data
    stride = per_block.strides[0]
    width = per_block.shape[1] * per_block.itemsize
    for j in range(min(ahead, rows.size)):
        for line in range(0, width, 64):
            prefetch(base + rows[j] * stride + line)
        prefetch(base + rows[j] * stride + width - 1)
    for j in range(rows.size):
        if j + ahead < rows.size:
            at = base + rows[j + ahead] * stride
            for line in range(0, width, 64):
                prefetch(at + line)
            prefetch(at + width - 1)  # the last line, where the row straddles one more
        r = rows[j]
        total = 0.0
        for b in range(per_block.shape[1]):
            total += np.float64(per_block[r, b]) * xblocks[b]
        ai = np.float64(a[r])
        keep[j] = not (ai + (total * SLACK + extra) < low) or ai == -np.inf
    return keep


@njit(cache=True)
def _without(rows, known):
    """rows (ascending i64) less those in known (sorted i64)."""
    out = np.empty(rows.size, np.int64)
    m = 0
    for j in range(rows.size):
        at = np.searchsorted(known, rows[j])
        out[m] = rows[j]
        m += np.int64(not (at < known.size and known[at] == rows[j]))
    return out[:m]
