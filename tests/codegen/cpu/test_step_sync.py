"""The compiled step's phase sharing (kinetic/codegen/cpu/step_sync.py): a thread that another
process keeps off its core does not hold the pass up, when it runs late it changes nothing, and a
thread waiting at a phase's end naps instead of spinning on."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from numba import njit

import kinetic
from kinetic.codegen.cpu import step_threads
from kinetic.codegen.cpu.step_drive import drive
from kinetic.codegen.cpu.step_sync import NONE_LEFT, SLEEPERS, USUAL, claim, finish, stamp, wait_or_steal
from tests.synthetic import synthetic_path

PROMPT = [5, 17, 3, 99, 42, 7, 250, 11]


class _AbsentWorker:
    """A worker's inbox nobody reads: the thread never gets a core while the pass runs."""

    def __init__(self):
        self.dispatches: list[tuple] = []

    def put(self, dispatch: tuple) -> None:
        self.dispatches.append(dispatch)


def _logits(model) -> list[np.ndarray]:
    engine = model.engine
    seq = engine.new_sequence()
    out = [engine.prefill(seq, PROMPT)]
    for token in (3, 8, 13):
        out.append(engine.decode(seq, token))
    return out


@pytest.fixture(scope="module")
def alone():
    return _logits(kinetic.Model(synthetic_path("llama"), n_ctx=64, threads=1))


def test_a_worker_that_never_runs_holds_no_pass_up(alone, monkeypatch):
    """Two threads whose worker never runs: every pass (a prompt, decode steps) ends, done by the
    calling thread alone, with the logits one thread gives bit for bit; then the worker, running
    each pass's work late, returns without changing a float of the arena."""
    absent = _AbsentWorker()
    monkeypatch.setattr(step_threads, "_pool", lambda n: [absent] * n)
    model = kinetic.Model(synthetic_path("llama"), n_ctx=64, threads=2)
    got: list = []
    runner = threading.Thread(target=lambda: got.append(_logits(model)), daemon=True)
    runner.start()
    runner.join(timeout=120)
    assert got, "a pass waited for the worker that never ran"
    assert all(np.array_equal(g, a) for g, a in zip(got[0], alone, strict=True))
    step = model.engine.runner
    before = step.arena.copy()
    assert len(absent.dispatches) >= 4
    for _keep, dispatch in absent.dispatches:  # the earlier passes' epochs are over, the last one's shares done
        assert drive(*dispatch) == 0
    assert np.array_equal(step.arena, before)


@njit(nogil=True)
def _stealing_wait(counters, epoch, shares, waits):
    return wait_or_steal(counters, epoch, shares, waits, True, 0)


def test_a_stealing_wait_naps_after_a_short_spin():
    """A thread waiting at the end of a phase that may be stolen, for holders that are running (no
    share overdue), spins only briefly, then sleeps on the phase (it shows among the phase's
    sleepers, handing its core over), and returns once the shares are finished, every share done."""
    counters = step_threads.PhaseCounters(1, 2)
    address, epoch = counters.next_stretch()
    counters.words[0, USUAL // 8] = 1 << 40  # the usual share: hours, so no share turns overdue here
    for _ in range(2):
        stamp(address, claim(address, epoch, 2))
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(_stealing_wait(address, epoch, 2, step_threads.WAITS)),
                              daemon=True)
    waiter.start()
    deadline = time.monotonic() + 5.0
    napped = False
    while not napped and time.monotonic() < deadline:
        napped = counters.words[0, SLEEPERS // 8] > 0
    for _ in range(2):
        finish(address, 2, step_threads.WAITS, 0)
    waiter.join(timeout=5.0)
    assert napped, "the waiting thread spun the whole time instead of napping"
    assert got and got[0][0] == NONE_LEFT
