"""The compiled step's phase sharing (kinetic/codegen/cpu/step_sync.py): a thread that another
process keeps off its core does not hold the pass up, and when it runs late it changes nothing."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kinetic
from kinetic.codegen.cpu import step_threads
from kinetic.codegen.cpu.step_drive import drive
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
