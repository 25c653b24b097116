"""Shortlist's scan and row choice: the copy's scores are the same on any number of threads, and the
groups' maxima only let whole groups be passed over, never change which rows are chosen."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.matmul import quantize_activations, quantized_matmul
from kinetic.codegen.cpu.shortlist import OutputHead
from kinetic.codegen.cpu.shortlist_copy import SLACK
from kinetic.codegen.cpu.shortlist_rows import (
    GROUP,
    _block_bound_keeps,
    best_rows,
    group_bounds,
    group_count,
    group_maxima,
    rows_reaching,
    summarize,
)
from kinetic.codegen.cpu.shortlist_scan import CHUNK_ROWS


def q8_layer(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """Random Q8_0 rows u8 [n, k/32*34]."""
    blocks = np.empty((n, k // 32, 34), np.uint8)
    blocks[:, :, :2] = rng.uniform(2.0**-8, 2.0**-4, (n, k // 32, 1)).astype(np.float16).view(np.uint8)
    blocks[:, :, 2:] = rng.integers(-127, 128, (n, k // 32, 32)).astype(np.int8).view(np.uint8)
    return blocks.reshape(n, -1)


def test_the_copy_scan_gives_the_same_scores_on_any_number_of_threads():
    """Rows shared out in chunks (the last one partial) get the scores one thread gives them, bit for
    bit, and the exact kernel's full layer is quantized_matmul's: a row's result does not depend on
    its chunk nor on the thread that computed it."""
    rng = np.random.default_rng(7)
    n, k = 3 * CHUNK_ROWS + 77, 128
    raw = q8_layer(rng, n, k)
    hidden = rng.standard_normal(k).astype(np.float32)
    heads = {t: OutputHead(raw, "q8_0", k, threads=t) for t in (1, 2, 3)}
    acts = quantize_activations(hidden[None], "q8_0")
    one = heads[1]._approximate(acts)
    reference = quantized_matmul(hidden[None], raw, Q.Q8_0, threads=1)
    for head in heads.values():
        copy = head._approximate(acts)
        assert np.array_equal(copy.scores, one.scores)
        assert np.array_equal(copy.groups.keys, one.groups.keys)
        assert np.array_equal(head.full(hidden[None]), reference)


def summarized(a: np.ndarray) -> np.ndarray:
    """The groups' keys as the scan's threads leave them, chunk by chunk."""
    keys = np.empty(group_count(len(a)), np.int32)
    for n0 in range(0, len(a), CHUNK_ROWS):
        summarize(a, n0, min(n0 + CHUNK_ROWS, len(a)), keys)
    return keys


@pytest.mark.parametrize("special", ["none", "nan", "-inf", "+inf"])
def test_group_maxima_never_change_the_rows_chosen(special):
    """best_rows and rows_reaching with the groups' maxima return exactly the rows a row-by-row pass
    returns (the row-bound test, NaN and -inf copy scores kept), for floors that keep few or many
    rows, with ties; the maxima do let most groups be passed over."""
    rng = np.random.default_rng(11)
    n = 2 * CHUNK_ROWS + 5 * GROUP + 3
    a = rng.standard_normal(n).astype(np.float32)
    a[100:140] = a[99]  # ties across a group boundary
    if special != "none":
        a[rng.choice(n, 5, replace=False)] = float(special.replace("none", "0"))
    c = rng.uniform(0.0, 0.05, n).astype(np.float32)
    xnorm, tiny = 3.0, 1e-40
    keys = summarized(a)
    groups = [a[g * GROUP:(g + 1) * GROUP].astype(np.float64) for g in range(len(keys))]
    highest = [np.inf if np.isnan(x).any() or (x == -np.inf).any() else x.max() for x in groups]
    assert np.array_equal(group_maxima(keys), highest)  # NaN and -inf groups: never passed over
    for m in (1, 7, 40):
        expected = np.sort(a[np.isfinite(a) | (a == np.inf)])[::-1][:m] if special != "nan" else None
        found = best_rows(a, m, keys)
        if expected is not None:
            assert np.array_equal(np.sort(a[found])[::-1], expected)
    finite = a[np.isfinite(a)]
    for floor in (float(finite.max()), float(np.sort(finite)[-200]), float(finite.min())):
        upper = a.astype(np.float64) + (c.astype(np.float64) * (xnorm * SLACK) + tiny * SLACK)
        low = floor - abs(floor) * 2.0**-40
        keep = ~(upper < low) | (a == -np.inf)
        known = np.array([int(np.flatnonzero(keep)[0])]) if keep.any() else np.empty(0, np.int64)
        keep[known] = False
        none = np.zeros((n, 0), np.float32)
        found = rows_reaching(a, c, xnorm, floor, tiny, none, np.empty(0), keys, group_bounds(c), known)
        assert np.array_equal(found, np.flatnonzero(keep))
    assert np.mean(group_maxima(keys) + 0.05 * xnorm < float(finite.max())) > 0.5  # most groups passed over


def test_block_bound_keeps_is_the_f64_block_bound_of_each_listed_row():
    """The block bound step reads each listed row's own block bounds (prefetched ahead or not): its
    decisions are a row-by-row f64 pass's, NaN and -inf copy scores kept."""
    rng = np.random.default_rng(5)
    n, b = 5000, 20
    a = rng.standard_normal(n).astype(np.float32)
    a[[7, 4000]] = np.nan, -np.inf
    per_block = rng.uniform(0.0, 0.02, (n, b)).astype(np.float32)
    xblocks = rng.uniform(0.5, 1.5, b)
    rows = np.sort(rng.choice(n, 700, replace=False)).astype(np.int64)
    rows[:2] = 7, 4000
    rows.sort()
    extra, low = 1e-40 * SLACK, 1.5
    total = np.array([sum(float(per_block[r, j]) * xblocks[j] for j in range(b)) for r in rows])
    ai = a[rows].astype(np.float64)
    expected = ~(ai + (total * SLACK + extra) < low) | (ai == -np.inf)
    assert 0 < expected.sum() < len(rows) // 2
    for ahead in (0, 8, 5000):
        assert np.array_equal(_block_bound_keeps(a, rows, per_block, xblocks, extra, low, ahead), expected)
