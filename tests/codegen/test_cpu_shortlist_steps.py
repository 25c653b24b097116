"""OutputHead.shortlist's step timing hook (StepTimes, read by benchmarks/shortlist_exact.py): timing the
real code's steps changes no answer, and every step's time and exact rows are counted once."""

from __future__ import annotations

import time

import numpy as np

from kinetic.codegen.cpu.shortlist import STEPS, OutputHead, StepTimes
from tests.codegen.test_cpu_shortlist_scan import q8_layer


def test_timed_steps_change_no_answer_and_count_each_exact_row_once():
    """With step_times set, shortlist() returns the same ids and scores as without; the exact rows the
    steps report add up to the rows returned, and the steps' times (each >= 0) add up to no more than
    the timed calls themselves took."""
    rng = np.random.default_rng(11)
    n, k = 5000, 128
    raw = q8_layer(rng, n, k)
    plain, timed = OutputHead(raw, "q8_0", k, threads=1), OutputHead(raw, "q8_0", k, threads=1)
    timed.step_times = StepTimes()
    returned, took = 0, 0.0  # took: the timed calls' own time (the plain calls between them are not theirs)
    for _ in range(3):
        hidden = rng.standard_normal(k).astype(np.float32)
        for top in (1, 40):
            want = plain.shortlist(hidden, top)
            began = time.process_time()
            got = timed.shortlist(hidden, top)
            took += time.process_time() - began
            assert np.array_equal(want.ids, got.ids) and np.array_equal(want.scores, got.scores)
            returned += len(got.ids)
    spent, rows = timed.step_times.spent, timed.step_times.rows
    assert set(spent) == set(STEPS) and all(s >= 0 for s in spent.values())
    assert sum(spent.values()) <= took
    assert rows["exact_first"] + rows["exact_rest"] == returned == timed.scored
    assert sum(rows.values()) == returned
