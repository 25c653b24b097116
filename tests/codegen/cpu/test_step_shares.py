"""Phases of many shares in the stealing tapes (kinetic/codegen/cpu/step_steal.py, "Shares"): a
stolen phase whose matmuls read many weight bytes (an output layer) is cut into a share for about
every SHARE_BYTES, and decode gives one thread's bits however the phases are cut, with a worker that
never runs, or with a worker stopped inside one of those shares."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kinetic
from kinetic.codegen.cpu import step_steal, step_threads, tape
from kinetic.codegen.cpu.step_sync import SHARES as SHARE_STATES
from kinetic.codegen.cpu.step_threads import PhaseCounters
from tests.codegen.cpu.test_step_steal import KERNEL, _Holdup, _Worker, decode_held
from tests.codegen.cpu.test_step_sync import _AbsentWorker
from tests.synthetic import synthetic_path

PROMPT = [5, 17, 3, 99, 42, 7]
TOKENS = (3, 8, 13, 21)
MB = 1 << 20


def _decode(model) -> list[np.ndarray]:
    engine = model.engine
    seq = engine.new_sequence()
    out = [engine.prefill(seq, PROMPT)]
    for t in TOKENS:
        out.append(engine.decode(seq, t))
    return out


def _same(got, want) -> bool:
    return len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def _model(threads: int, path=None):
    # without Shortlist one runner (the full graph's, with its output layer) runs every pass
    return kinetic.Model(path or synthetic_path("llama"), n_ctx=64, threads=threads, shortlist=False)


def test_a_stolen_phase_gets_a_share_for_about_every_share_bytes_of_weights():
    """Two threads: 0.5 MB of weights keeps the threads' count (0 in the column), 3.5 MB gets 4
    shares, 1 GB the most, 128; a phase that may not be stolen keeps its count whatever it reads;
    every row of a phase carries its count."""
    rows = np.zeros((8, tape.TAPE_WIDTH), np.int64)
    rows[:, tape.OP] = tape.OP_MATMUL
    rows[:, tape.FLAGS] = tape.FLAG_STEAL
    rows[[1, 3, 5, 7], tape.FLAGS] |= tape.FLAG_BARRIER  # phases 0-1, 2-3, 4-5, 6-7
    rows[6:, tape.FLAGS] &= ~tape.FLAG_STEAL
    weight_bytes = np.array([MB // 4, MB // 4, 3 * MB, MB // 2, 1 << 30, 0, 1 << 30, 0], np.int64)
    step_steal.share_counts(rows, weight_bytes, 2)
    assert rows[:, tape.SHARES].tolist() == [0, 0, 4, 4, step_steal.MOST_SHARES, step_steal.MOST_SHARES, 0, 0]
    assert step_steal.MOST_SHARES == 128


@pytest.mark.parametrize("name, shares", [("smollm2-135m", 32), ("gemma3-270m", 128)])
def test_the_output_layer_is_the_real_models_one_phase_of_many_shares(name, shares):
    """SmolLM2's output layer (30 MB, Q8_0) gets 32 shares, Gemma 3's (178 MB) 128; no other phase
    reads enough to get more than one a thread, and the counters have room for each phase's."""
    model = _model(2, name)
    steal = model.engine.runner.steal
    many = steal.shares()
    assert list(many.values()) == [shares]
    rows = steal.sets[0].tape
    in_phase = np.flatnonzero(rows[:, tape.SHARES])
    matmuls = in_phase[rows[in_phase, tape.OP] == tape.OP_MATMUL]
    vocab = model.engine.n_vocab
    assert [int(rows[i, tape.MATMUL_N]) for i in matmuls] == [vocab]  # the output layer, alone
    assert steal.counters.stride >= step_threads.sync_words(shares)


def test_counters_start_every_share_of_every_phase_anew():
    """A stretch's counters: every share's state of a phase of many shares is tagged with the new
    epoch (an untagged one would count as committed or claimed from the stretch before)."""
    counters = PhaseCounters(3, 2, [2, 128, 1])
    first = SHARE_STATES // 8
    _, epoch = counters.next_stretch()
    words = counters.words
    for phase, shares in enumerate([2, 128, 1]):
        assert np.all(words[phase, first: first + 2 * shares: 2] == epoch << 32) and words[phase, 0] == epoch << 32
    words[1, :] = 7  # a stretch that ran
    _, epoch = counters.next_stretch()
    assert np.all(words[1, first: first + 256: 2] == epoch << 32)


@pytest.fixture(scope="module")
def alone():
    return _decode(_model(1))


@pytest.fixture
def small_shares(monkeypatch):
    """Shares of 1 KB: the synthetic model's matmul phases get many shares (most of them 128)."""
    monkeypatch.setattr(step_steal, "SHARE_BYTES", 1024)


def test_decode_in_many_shares_gives_one_threads_bits(alone, small_shares, monkeypatch):
    """Two threads with most matmul phases in many shares = one thread, bit for bit; so is a pass
    whose worker never runs (the caller claims every share, one at a time)."""
    model = _model(2)
    many = model.engine.runner.steal.shares()
    assert len(many) >= 4 and max(many.values()) == step_steal.MOST_SHARES
    assert _same(_decode(model), alone)
    absent = _AbsentWorker()
    monkeypatch.setattr(step_threads, "_pool", lambda n: [absent] * n)
    got: list = []
    runner = threading.Thread(target=lambda: got.append(_decode(_model(2))), daemon=True)
    runner.start()
    runner.join(timeout=300)
    assert got and _same(got[0], alone), "the caller alone in many shares changed the bits"


def test_a_worker_stopped_inside_one_of_many_shares_holds_nothing_up(alone, small_shares, monkeypatch):
    """A worker stopped inside a share of a phase of many shares: the caller runs every other share,
    takes the stopped one over once it is overdue, and every step gives one thread's bits before
    the worker is released; the worker, released, leaves no count behind."""
    worker = _Worker()
    monkeypatch.setattr(step_threads, "_pool", lambda n: [worker] * n)
    model = _model(2)
    steal = model.engine.runner.steal
    rows = steal.sets[0].tape
    at = next(i for i in range(len(rows)) if rows[i, tape.OP] == tape.OP_MATMUL and rows[i, tape.SHARES] >= 8)
    real = KERNEL(int(rows[at, tape.MATMUL_KERNEL]))
    holdup = _Holdup(lambda *args: real(*args))
    for arena_set in steal.sets:
        arena_set.tape[at, tape.MATMUL_KERNEL] = holdup.address
    got, released = decode_held(model.engine, holdup, PROMPT, TOKENS, 5.0)
    assert len(holdup.stopped) == 1
    assert released[0] is False, "the first step waited for the stopped worker"
    assert _same(got, alone)
    for thread in worker.threads:
        thread.join(60)
    assert not steal.counts.any()
