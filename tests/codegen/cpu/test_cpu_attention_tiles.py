"""The prompt attention tiles (step_attention.attend_tiles on attention_tile_ir's kernel, rendered
for the order's accumulator) give every row bit for bit what `numerics.attention_online` gives it
alone: any row count (tiles full, partial, several), GQA groups, head dims 64 to 512, softcap,
sliding windows, several sequences in one pass, draft-tree rows, committed positions out of order,
rows that see nothing, any split into shares; in both orders of an f16 cache (ggml's f16
accumulator, "key_chain_f16_acc32"'s f32 one)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kinetic.codegen.cpu import attention_tile_ir
from kinetic.codegen.cpu.attention_tile_ir import render_tile
from kinetic.codegen.cpu.jit import default_jit
from kinetic.codegen.cpu.step_attention import TILE_LANES, attend, attend_tiles, row_span, tile_heads
from kinetic.ir import numerics
from kinetic.ir.numerics.attention import f16_cache_accumulator

ORDERS = ["key_chain_f16", "key_chain_f16_acc32"]
pytestmark = pytest.mark.skipif(numerics._LIBM is None, reason="the C library cannot be loaded")


def _bits(x) -> np.ndarray:
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


class Pass:
    """A pass's tables as PassTables lays them out: rows in `seqs` order of appearance per slot,
    each slot's committed entries (positions `cpos`) then its pass rows, `anc` who sees whom."""

    def __init__(self, rng, a, row_seq, n_committed, positions, anc, cpos=None):
        self.a, self.rng = a, rng
        self.row_seq = np.asarray(row_seq, np.int32)
        n_slots = int(self.row_seq.max()) + 1
        self.positions = np.asarray(positions, np.int32)
        self.anc = np.ascontiguousarray(anc, np.uint8)
        counts = np.bincount(self.row_seq, minlength=n_slots)
        self.slot_rows = np.full((n_slots, counts.max()), -1, np.int32)
        for s in range(n_slots):
            self.slot_rows[s, : counts[s]] = np.flatnonzero(self.row_seq == s)
        self.clen = np.asarray(n_committed, np.int64)
        width = a.n_kv_head * a.head_dim
        self.cpos = [np.arange(n + 1, dtype=np.int32) if cpos is None else np.append(cpos[s], 0).astype(np.int32)
                     for s, n in enumerate(self.clen)]
        size = lambda s: self.clen[s] + counts.max()  # noqa: E731
        scale_k, scale_v = rng.uniform(0.1, 4), rng.uniform(1e-3, 4)
        self.keys = [(rng.standard_normal((size(s), width)) * scale_k).astype(np.float16) for s in range(n_slots)]
        self.vals = [(rng.standard_normal((size(s), width)) * scale_v).astype(np.float16) for s in range(n_slots)]
        rows = len(self.row_seq)
        self.q = (rng.standard_normal((rows, a.n_head * a.head_dim)) * rng.uniform(0.1, 8)).astype(np.float32)

    def visible(self, r: int, window: int) -> np.ndarray:
        """The rule of kinetic.ir.rows.visibility, restated: committed entries at or before the row's
        position, its pass ancestors (itself included), inside the window."""
        s = self.row_seq[r]
        pos = int(self.positions[r])
        inside = lambda p: (p <= pos) & ((window == 0) | (p > pos - window))  # noqa: E731
        committed = inside(self.cpos[s][: self.clen[s]].astype(np.int64))
        mine = self.slot_rows[s]
        own = np.array([m >= 0 and self.anc[r, m] != 0 and (window == 0 or self.positions[m] > pos - window)
                        for m in mine], bool)
        return np.concatenate([committed, own])

    def reference(self, window: int) -> np.ndarray:
        out = np.empty_like(self.q)
        for r in range(len(self.row_seq)):
            s = self.row_seq[r]
            mask = self.visible(r, window)[None, :]
            out[r] = numerics.attention_online(self.q[r : r + 1], self.keys[s], self.vals[s], mask, self.a)[0]
        return out

    def run(self, window: int, tile_fn: int, shares: int = 1, tiles: bool = True) -> np.ndarray:
        a = self.a
        rows, width = self.q.shape
        arena = np.full(2 * rows * width, np.nan, np.float32)
        arena[: rows * width] = self.q.reshape(-1)
        kp = np.array([k.ctypes.data for k in self.keys], np.int64)
        vp = np.array([v.ctypes.data for v in self.vals], np.int64)
        cpos_addr = np.array([c.ctypes.data for c in self.cpos], np.int64)
        scale, cap = _scale_cap(a)
        for share in range(shares):
            args = (arena, 0, rows * width, kp, vp, a.n_kv_head * a.head_dim, a.n_head, a.n_kv_head, a.head_dim)
            bits = (int(scale.view(np.uint32)), int(cap.view(np.uint32)))
            if tiles:
                attend_tiles(*args, window, share, shares, self.positions, self.slot_rows, self.clen, cpos_addr,
                             self.anc, tile_fn, *bits)
            else:  # through the dispatcher (the numba one-row path: no generated kernels)
                attend(*args, scale, cap, window, share, shares, rows, self.positions, self.row_seq, self.slot_rows,
                       self.clen, cpos_addr, self.anc, 0, 0, 1, tile_fn, *bits, f16_cache_accumulator(a) == "f32")
        return arena[rows * width :].reshape(rows, width)


def _scale_cap(a):
    if a.softcap:
        return np.float32(np.float32(a.scale) / np.float32(a.softcap)), np.float32(a.softcap)
    return np.float32(a.scale), np.float32(0)


def _tile_kernel(a, vector_expf=None) -> int:
    """The tile kernel of a's order (as step_kernels.attention_tile picks it)."""
    return default_jit().address(*render_tile(a.head_dim, bool(a.softcap), vector_expf,
                                              accumulator=f16_cache_accumulator(a)))


def _attrs(n_head, n_kv_head, head_dim, softcap=0.0, scale=0.125, order="key_chain_f16"):
    return SimpleNamespace(n_head=n_head, n_kv_head=n_kv_head, head_dim=head_dim, scale=scale, softcap=softcap,
                           order=order)


def _in_order(a, order: str):
    return SimpleNamespace(**{**vars(a), "order": order})


def _prompt(rng, a, rows, n_c):
    """One sequence's prompt chunk: n_c committed entries at positions 0.., then `rows` rows."""
    return Pass(rng, a, np.zeros(rows, np.int32), [n_c], np.arange(n_c, n_c + rows), np.tri(rows, dtype=np.uint8))


SHAPES = [_attrs(9, 3, 64), _attrs(4, 1, 256), _attrs(8, 8, 64, softcap=30.0), _attrs(4, 2, 128, scale=0.0625),
          _attrs(32, 1, 64), _attrs(6, 1, 192, softcap=50.0),
          _attrs(2, 1, 512, scale=0.04)]  # head dim 512: a lane's accumulators in two groups


def test_tile_lanes_match_the_kernel():
    """The driver lays out as many chains as the kernel has lanes, and a tile's heads divide the group."""
    assert TILE_LANES == attention_tile_ir.LANES
    for group in range(1, 70):
        heads = tile_heads(group)
        assert group % heads == 0 and heads <= TILE_LANES
        assert not any(group % g == 0 for g in range(heads + 1, TILE_LANES + 1))


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_every_row_count_gives_the_reference(shape, order):
    """Prompt chunks of 1..40 rows (one tile, partial tiles, rows across tile boundaries) after 0-90
    committed entries: each row's bits are the reference's for that row alone."""
    a = _in_order(SHAPES[shape], order)
    rng = np.random.default_rng(10 + shape)
    tile_fn = _tile_kernel(a)
    counts = range(1, 41) if shape == 0 else (1, 2, 5, 6, 15, 16, 17, 33)
    for rows in counts:
        p = _prompt(rng, a, rows, int(rng.integers(0, 90)))
        assert np.array_equal(_bits(p.run(0, tile_fn)), _bits(p.reference(0))), rows


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("window", [1, 3, 17, 64])
@pytest.mark.parametrize("shape", [0, 1, 2])
def test_sliding_windows(shape, window, order):
    """Sliding windows smaller and larger than the chunk, over committed entries and pass rows."""
    a = _in_order(SHAPES[shape], order)
    rng = np.random.default_rng(window)
    p = _prompt(rng, a, 23, 50)
    assert np.array_equal(_bits(p.run(window, _tile_kernel(a))), _bits(p.reference(window)))


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("shares", [1, 2, 3, 7])
def test_several_sequences_in_one_pass(shares, order):
    """Convoy's pass: rows of three sequences interleaved, each with its own cache length; any split
    into shares gives every row the reference's bits."""
    a = _in_order(SHAPES[0], order)
    rng = np.random.default_rng(3)
    row_seq = rng.permutation(np.repeat([0, 1, 2], [7, 1, 12]))
    n_c = [40, 3, 0]
    positions = np.zeros(len(row_seq), np.int32)
    anc = np.zeros((len(row_seq), len(row_seq)), np.uint8)
    for s in range(3):
        mine = np.flatnonzero(row_seq == s)
        positions[mine] = n_c[s] + np.arange(len(mine))
        for i, r in enumerate(mine):
            anc[r, mine[: i + 1]] = 1
    p = Pass(rng, a, row_seq, n_c, positions, anc)
    assert np.array_equal(_bits(p.run(0, _tile_kernel(a), shares)), _bits(p.reference(0)))


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("window", [0, 4])
def test_draft_tree_rows_see_their_paths(window, order):
    """A draft tree's rows each see the committed entries and their own ancestors (not a run of the
    pass's rows): the per-key table gives every row its path's bits."""
    a = _in_order(SHAPES[0], order)
    rng = np.random.default_rng(5)
    parents = [-1, 0, 0, 1, 1, 2, 3, 3, 5, 6, 6, 4]
    depth = [0] * len(parents)
    anc = np.zeros((len(parents), len(parents)), np.uint8)
    for r, parent in enumerate(parents):
        depth[r] = depth[parent] + 1 if parent >= 0 else 0
        anc[r, r] = 1
        if parent >= 0:
            anc[r] |= anc[parent]
    n_c = 30
    p = Pass(rng, a, np.zeros(len(parents), np.int32), [n_c], n_c + np.array(depth), anc)
    assert np.array_equal(_bits(p.run(window, _tile_kernel(a))), _bits(p.reference(window)))


@pytest.mark.parametrize("order", ORDERS)
def test_committed_positions_out_of_order_and_rows_that_see_nothing(order):
    """Committed positions that are not ascending, half of them after the rows' (searched key by
    key), and a row whose window holds no entry (zeros), in one tile with ordinary rows."""
    a = _in_order(SHAPES[0], order)
    rng = np.random.default_rng(8)
    cpos = rng.permutation(np.arange(0, 80, 2))
    rows = 6
    p = Pass(rng, a, np.zeros(rows, np.int32), [40], 40 + np.arange(rows), np.tri(rows, dtype=np.uint8),
             cpos=[cpos])
    assert np.array_equal(_bits(p.run(0, _tile_kernel(a))), _bits(p.reference(0)))
    anc = np.tri(rows, dtype=np.uint8)
    anc[2] = 0  # row 2 sees no pass row, and no committed entry lies in its window
    p = Pass(rng, a, np.zeros(rows, np.int32), [10], [12, 13, 60, 61, 62, 63], anc)
    got = p.run(3, _tile_kernel(a))
    assert np.array_equal(_bits(got), _bits(p.reference(3)))
    assert not got[2].any()


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("vector_expf", [True, False], ids=["vector-expf", "libm-expf"])
def test_long_rows_and_keys_scoring_minus_infinity(vector_expf, order):
    """Rows over 500-700 keys with keys scoring -inf after a finite maximum (weight 0) and large
    scores (new maxima rescale the accumulator), with glibc's expf vectorized and called."""
    a = _in_order(SHAPES[1], order)
    rng = np.random.default_rng(21)
    p = _prompt(rng, a, 9, 560)
    p.q = np.abs(p.q)
    p.keys[0][rng.choice(np.arange(40, 560), 12, replace=False)] = -np.inf  # q >= 0: these keys score -inf
    assert np.array_equal(_bits(p.run(0, _tile_kernel(a, vector_expf))), _bits(p.reference(0)))


@pytest.mark.parametrize("order", ORDERS)
def test_rows_sharing_a_tile_do_not_change_a_row(order):
    """Batch invariance directly: a row's output alone (one-row tile) equals its output in tiles of
    2..16 rows, and the one-row dispatch path gives the same bits."""
    a = _in_order(SHAPES[3], order)
    rng = np.random.default_rng(4)
    full = _prompt(rng, a, 16, 20)
    tile_fn = _tile_kernel(a)
    together = full.run(0, tile_fn)
    for keep in (1, 2, 7, 16):
        part = _prompt(np.random.default_rng(0), a, keep, 20)
        part.keys, part.vals, part.q = full.keys, full.vals, full.q[:keep]
        assert np.array_equal(_bits(part.run(0, tile_fn)), _bits(together[:keep]))
    assert np.array_equal(_bits(full.run(0, tile_fn, tiles=False)), _bits(together))


@pytest.mark.parametrize("head_dim", [64, 128, 192, 256, 320, 512, 1024])
def test_accumulator_groups_cover_every_vector_once(head_dim):
    """The tile's second phase holds every (lane, 16-value part) accumulator in exactly one group,
    and no group more than GROUP_FLOATS floats."""
    groups = attention_tile_ir._groups(head_dim, attention_tile_ir.GROUP_FLOATS)
    held = [(lane, part) for lanes, parts in groups for lane in lanes for part in parts]
    assert sorted(held) == [(lane, part) for lane in range(TILE_LANES) for part in range(head_dim // 16)]
    assert all(len(lanes) * len(parts) * 16 <= attention_tile_ir.GROUP_FLOATS for lanes, parts in groups)


def test_a_row_span_is_its_visible_run():
    """row_span's [lo, hi) is exactly the visible keys when it says one run, and bounds them else."""
    rng = np.random.default_rng(2)
    for _ in range(200):
        rows, n_c = int(rng.integers(1, 9)), int(rng.integers(0, 12))
        anc = np.tri(rows, dtype=np.uint8) if rng.random() < 0.5 else (rng.random((rows, rows)) < 0.5).astype(np.uint8)
        cpos = np.sort(rng.integers(0, 20, n_c)) if rng.random() < 0.7 else rng.integers(0, 20, n_c)
        p = Pass(rng, _attrs(1, 1, 64), np.zeros(rows, np.int32), [n_c], rng.integers(0, 24, rows), anc,
                 cpos=[cpos.astype(np.int32)])
        window = int(rng.choice([0, 1, 5]))
        ascending = bool(np.all(np.diff(cpos) >= 0))
        for r in range(rows):
            lo, hi, one_run = row_span(r, n_c, p.cpos[0], ascending, p.slot_rows[0], p.anc, p.positions, window)
            seen = np.flatnonzero(p.visible(r, window))
            assert seen.size == 0 or (lo <= seen.min() and seen.max() < hi)
            if one_run:
                assert np.array_equal(seen, np.arange(lo, hi))


def test_head_dims_off_the_chunk_are_not_rendered():
    """Head dims off the 64 grid, and accumulators of no order, are refused."""
    with pytest.raises(ValueError):
        render_tile(96, False)
    with pytest.raises(ValueError):
        render_tile(96, False, accumulator="f32")
    with pytest.raises(ValueError):
        render_tile(64, False, accumulator="bf16")


def test_the_orders_differ_where_the_accumulator_rounds():
    """The two orders are different computations (the f32 accumulator is not rounded to f16): over
    a prompt their kernels' outputs differ somewhere, so the tests above compare each kernel with its
    own order's reference."""
    rng = np.random.default_rng(6)
    p = _prompt(rng, _in_order(SHAPES[0], ORDERS[0]), 16, 40)
    ggml = p.run(0, _tile_kernel(p.a))
    p.a = _in_order(p.a, ORDERS[1])
    assert not np.array_equal(_bits(p.run(0, _tile_kernel(p.a))), _bits(ggml))
