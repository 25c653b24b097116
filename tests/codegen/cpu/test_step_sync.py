"""The compiled step's phase sharing (kinetic/codegen/cpu/step_sync.py): a thread that another
process keeps off its core does not hold the pass up, when it runs late it changes nothing, a
thread waiting at a phase's end naps instead of spinning on, and a thread left alone runs the
shares left as one."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from numba import njit

import kinetic
from kinetic.codegen.cpu import step_threads
from kinetic.codegen.cpu.step_drive import drive
from kinetic.codegen.cpu.step_sync import (
    ARRIVED,
    COUNT,
    NONE_LEFT,
    SHARES,
    SLEEPERS,
    USUAL,
    arrive,
    claim,
    claim_rest,
    finish,
    stamp,
    wait_or_steal,
)
from kinetic.codegen.cpu.step_sync import alone as only_one_came  # `alone` is a fixture here
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
    _stealing_wait.compile("(int64, int64, int64, int64[::1])")  # not in the waiter's time (a loaded machine)
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


def test_a_thread_no_other_followed_for_two_phases_claims_every_share_left():
    """`alone` holds at a phase only when the two phases before it each saw one thread come (and
    never at the first two phases of a stretch); claim_rest then takes every unclaimed share."""
    counters = step_threads.PhaseCounters(4, 2)
    address, epoch = counters.next_stretch()
    stride = 8 * counters.stride

    def came_alone(phase):
        return only_one_came(address + phase * stride, stride, epoch, phase)

    for phase in range(4):
        arrive(address + phase * stride)
    assert [came_alone(phase) for phase in range(4)] == [False, False, True, True]
    arrive(address + stride)  # the other thread came to phase 1 (late): not alone at phases 2 and 3
    assert [came_alone(phase) for phase in range(4)] == [False, False, False, False]
    counters.next_stretch()  # a new stretch: nobody has come anywhere
    assert (counters.words[:, ARRIVED // 8] & COUNT == 0).all()
    address, epoch = counters.words.ctypes.data, counters.epoch
    assert claim(address, epoch, 3) == 0
    assert claim_rest(address, epoch, 3) == 1  # shares 1 and 2
    assert counters.words[0, 0] & COUNT == 3 and claim(address, epoch, 3) == NONE_LEFT


def test_a_thread_left_alone_runs_a_phases_shares_as_one(alone, monkeypatch):
    """Two threads whose worker never runs: after the two first phases of a decode pass, the
    calling thread claims both shares of each phase of two together (one stamp for both, one call
    an op), and the logits are one thread's bit for bit."""
    absent = _AbsentWorker()
    monkeypatch.setattr(step_threads, "_pool", lambda n: [absent] * n)
    model = kinetic.Model(synthetic_path("llama"), n_ctx=64, threads=2)
    got = _logits(model)
    assert all(np.array_equal(g, a) for g, a in zip(got, alone, strict=True))
    engine = model.engine
    steps = [r for r in (engine.runner, getattr(engine.output, "full", None)) if getattr(r, "steal", None)]
    words = max((s.steal.counters for s in steps), key=lambda c: c.epoch).words  # the last decode pass's
    both = np.flatnonzero(words[:, 0] & COUNT == 2)  # phases of two shares
    began = words[both][:, [SHARES // 8 + 1, SHARES // 8 + 3]]
    assert len(both) > 2 and both[0] < 2
    assert (began[both >= 2, 0] == began[both >= 2, 1]).all(), "a phase's shares ran one after the other"
    assert (began[both < 2, 0] < began[both < 2, 1]).all()
