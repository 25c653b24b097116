"""Stealing a preempted holder's share (kinetic/codegen/cpu/step_sync.py, "Stealing"; step_steal.py):
a thread stopped inside a share holds its phase up only briefly, the share's side effects run once,
and the stopped thread, when it runs again, changes no bit and never writes into an arena a later
pass is using. A thread is stopped deterministically by a kernel that blocks it (a ctypes callback
at a tape row's kernel address)."""

from __future__ import annotations

import ctypes
import threading
import time

import numpy as np
import pytest

import kinetic
from kinetic.codegen.cpu import step_threads, tape
from kinetic.codegen.cpu.step_drive import drive
from kinetic.codegen.cpu.step_threads import PhaseCounters, run_parallel
from kinetic.codegen.cpu.tape_plan import steal_flags
from tests.synthetic import synthetic_path

KERNEL = ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * 9)  # a matmul kernel: w, q, d, e, y, rows, n0, n1, n
N = 64  # output columns of the test tape's matmul
WAIT = 60  # seconds before a test gives up on a thread


class _Worker:
    """A worker's inbox that runs each dispatch on a thread of its own, keeping the threads."""

    def __init__(self):
        self.threads: list[threading.Thread] = []

    def put(self, item: tuple) -> None:
        _keep, dispatch = item
        thread = threading.Thread(target=drive, args=dispatch, daemon=True)
        thread.start()
        self.threads.append(thread)


class _Holdup:
    """A kernel wrapper that stops worker threads (the first `stops` to call it, each at its first
    call) until `release`. The caller's first call for each of the first `stops` outputs (a pass's
    arena) waits until a worker has stopped there, so a worker holds a share of that pass's phase."""

    def __init__(self, run, stops: int = 1):
        self.run, self.stops = run, stops  # run(w, q, d, e, y, rows, n0, n1, n): the kernel's work
        self.caller = threading.get_ident()
        self.stopped: list[int] = []  # the output address of each stopped worker's share
        self.release = threading.Event()
        self.kernel = KERNEL(self._call)
        self._changed = threading.Condition()
        self._workers: set[int] = set()
        self._awaited: set[int] = set()

    def _call(self, w, q, d, e, y, *rest) -> None:
        me = threading.get_ident()
        if me != self.caller:
            with self._changed:
                stop = me not in self._workers and len(self.stopped) < self.stops
                self._workers.add(me)
                if stop:
                    self.stopped.append(y)
                    self._changed.notify_all()
            if stop:
                self.release.wait(WAIT)
        elif y not in self._awaited and len(self._awaited) < self.stops:
            self._awaited.add(y)
            with self._changed:
                self._changed.wait_for(lambda: y in self.stopped, WAIT)
        self.run(w, q, d, e, y, *rest)

    @property
    def address(self) -> int:
        return ctypes.cast(self.kernel, ctypes.c_void_p).value


def decode_held(engine, holdup: _Holdup, prompt: list[int], tokens, release_after: float):
    """A prompt's logits, then a decode step's for each token, with `holdup`'s workers released
    `release_after` seconds in: (the logits, per step whether they had been released after it)."""
    seq = engine.new_sequence()
    got = [engine.prefill(seq, prompt)]
    released: list[bool] = []
    timer = threading.Timer(release_after, holdup.release.set)
    timer.start()
    try:
        for t in tokens:
            got.append(engine.decode(seq, t))
            released.append(holdup.release.is_set())
    finally:
        holdup.release.set()
    return got, released


def _floats(address: int, n: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(address))


def _tape(kernel: int, counter: int, flags: int) -> tuple[np.ndarray, np.ndarray]:
    """Phase 1: the matmul `kernel` into y [N] and the commit op `counter` (a kernel that records the
    shares it is called for); phase 2: z = 2 * y, columns split."""
    rows = np.zeros((3, tape.TAPE_WIDTH), np.int64)
    rows[0, [tape.OP, tape.MATMUL_KERNEL, tape.MATMUL_Y, tape.MATMUL_N]] = tape.OP_MATMUL, kernel, 0, N
    rows[1, [tape.OP, tape.MATMUL_KERNEL, tape.MATMUL_Y, tape.MATMUL_N]] = tape.OP_MATMUL, counter, 0, N
    rows[1, tape.FLAGS] = tape.FLAG_BARRIER | (tape.FLAG_COMMIT if flags else 0)
    rows[2, [tape.OP, tape.EW_X, tape.EW_Y, tape.EW_WIDTH, tape.WIDTH, tape.UNIT]] = tape.OP_SCALE, 0, N, N, N, 16
    rows[:, tape.FLAGS] |= flags | tape.FLAG_COLUMNS
    floats = np.zeros((3, tape.FLOAT_WIDTH), np.float64)
    floats[2, tape.SCALE_FACTOR] = 2.0
    return rows, floats


def _pass_tables():
    """One row's tables, typed as the step passes them (the test tape reads none of them)."""
    i32 = np.zeros(1, np.int32)
    return (1, 1, i32, i32, i32, i32, i32, np.zeros((1, 1), np.int32), np.ones((1, 1), np.uint8),
            np.zeros((1, 0, 2), np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(65536, np.float32))


def _run_with_holdup(monkeypatch, flags: int):
    worker = _Worker()
    monkeypatch.setattr(step_threads, "_pool", lambda n: [worker] * n)
    arena = np.zeros(2 * N + 16, np.float32)
    commits: list[tuple[int, int]] = []

    def matmul(w, q, d, e, y, rows, n0, n1, n):
        _floats(y, n)[n0:n1] = np.arange(n0, n1, dtype=np.float32) * np.float32(0.75) + np.float32(1)

    counter = KERNEL(lambda w, q, d, e, y, rows, n0, n1, n: commits.append((n0, n1)))
    active = np.zeros(8, np.int64)
    result: list = []
    holdup_box: list = []

    def caller():
        holdup = _Holdup(matmul)
        holdup_box.append(holdup)
        rows, floats = _tape(holdup.address, ctypes.cast(counter, ctypes.c_void_p).value, flags)
        common = (arena, arena.ctypes.data) + _pass_tables()
        run_parallel(rows, floats, (0, 3), 2, common, PhaseCounters(3, 2), np.zeros((3, 2), np.int64),
                     active.ctypes.data)
        result.append(arena.copy())

    warm = KERNEL(matmul)  # a first run without a stop: compiles the driver for these types
    rows, floats = _tape(ctypes.cast(warm, ctypes.c_void_p).value, ctypes.cast(counter, ctypes.c_void_p).value, flags)
    common = (arena, arena.ctypes.data) + _pass_tables()
    run_parallel(rows, floats, (0, 3), 2, common, PhaseCounters(3, 2), np.zeros((3, 2), np.int64), active.ctypes.data)
    for thread in worker.threads:
        thread.join(WAIT)
    worker.threads.clear()
    commits.clear()
    arena[:] = 0
    runner = threading.Thread(target=caller, daemon=True)
    runner.start()
    runner.join(timeout=10)
    return worker, holdup_box[0], arena, commits, active, result


def test_a_stopped_holder_holds_its_phase_up_only_briefly(monkeypatch):
    """A worker stopped inside its share: the pass ends without it, with every value right and the
    share's commit op run once per share; when the worker runs again it finishes the share (the same
    bits), commits nothing and leaves the arena's count of working threads at zero."""
    worker, holdup, arena, commits, active, result = _run_with_holdup(monkeypatch, tape.FLAG_STEAL)
    try:
        assert result, "the pass waited for the stopped worker"
        assert not holdup.release.is_set() and worker.threads[0].is_alive()
        y = np.arange(N, dtype=np.float32) * np.float32(0.75) + np.float32(1)
        assert np.array_equal(result[0][:N], y) and np.array_equal(result[0][N: 2 * N], y * np.float32(2))
        assert sorted(commits) == [(0, N // 2), (N // 2, N)]
        assert active[0] == 1  # the stopped worker is still working in the arena
    finally:
        holdup.release.set()
    worker.threads[0].join(WAIT)
    assert not worker.threads[0].is_alive()
    assert np.array_equal(arena, result[0])
    assert sorted(commits) == [(0, N // 2), (N // 2, N)]
    assert active[0] == 0


def test_without_stealing_the_stopped_holder_holds_the_phase(monkeypatch):
    """The same tape without FLAG_STEAL: the pass waits for the stopped worker (what stealing
    removes), then ends with the same values once it runs."""
    worker, holdup, arena, commits, _active, result = _run_with_holdup(monkeypatch, 0)
    assert not result
    holdup.release.set()
    worker.threads[0].join(WAIT)
    deadline = time.monotonic() + WAIT
    while not result and time.monotonic() < deadline:
        time.sleep(0.01)
    assert result and sorted(commits) == [(0, N // 2), (N // 2, N)]


PROMPT = [5, 17, 3, 99, 42, 7, 250, 11]
TOKENS = [3, 8, 13, 21, 34]


def _decode(model) -> list[np.ndarray]:
    engine = model.engine
    seq = engine.new_sequence()
    out = [engine.prefill(seq, PROMPT)]
    out += [engine.decode(seq, t) for t in TOKENS]
    return out


@pytest.fixture(scope="module")
def alone():
    return _decode(kinetic.Model(synthetic_path("llama"), n_ctx=64, threads=1))


@pytest.mark.parametrize("stops", [1, 2])
def test_a_model_decodes_past_stopped_workers_and_never_reuses_their_arenas(alone, monkeypatch, stops):
    """Decode on two threads with a worker stopped inside a matmul share of the first step (and with
    stops=2 another in the second): no step waits while an arena set is free, none runs in an arena
    a stopped worker is still working in (with both sets held, the third step waits for the release);
    every step's logits are one thread's bit for bit, and the stopped workers leave no count behind."""
    worker = _Worker()
    monkeypatch.setattr(step_threads, "_pool", lambda n: [worker] * n)
    # without Shortlist one runner (the full graph's) runs every pass, the one whose tapes are held up
    model = kinetic.Model(synthetic_path("llama"), n_ctx=64, threads=2, shortlist=False)
    steal = model.engine.runner.steal
    at = int(np.flatnonzero(steal.sets[0].tape[:, tape.OP] == tape.OP_MATMUL)[3])
    real = KERNEL(int(steal.sets[0].tape[at, tape.MATMUL_KERNEL]))
    holdup = _Holdup(lambda *args: real(*args), stops)
    for arena_set in steal.sets:
        assert arena_set.tape[at, tape.FLAGS] & tape.FLAG_STEAL
        arena_set.tape[at, tape.MATMUL_KERNEL] = holdup.address
    acquire, chosen = steal.acquire, []
    monkeypatch.setattr(steal, "acquire", lambda: chosen.append(acquire()) or chosen[-1])
    got, released = decode_held(model.engine, holdup, PROMPT, TOKENS, 2.0)
    assert len(holdup.stopped) == stops
    if stops == 1:
        assert released == [False] * len(TOKENS), "a step waited for the stopped worker"
        assert all(s is not chosen[0] for s in chosen[1:]), "a step ran in the stopped worker's arena"
    else:  # (a step may also wait briefly for a worker of the step before, late on a loaded machine)
        assert released[:2] == [False, False] and all(released[2:]), (
            "the third step ran in an arena a stopped worker was still working in")
        assert steal.waits >= 1
    assert all(np.array_equal(g, a) for g, a in zip(got, alone, strict=True))
    for thread in worker.threads:
        thread.join(WAIT)
    assert not steal.counts.any()


def test_the_stealing_plan_keeps_every_buffer_and_flags_only_safe_phases():
    """The one-row tape's buffers never share arena bytes (a late share's writes land nowhere
    else); every KV store is a commit op of a stolen phase; an op outside STEALABLE makes its phase
    unstealable."""
    model = kinetic.Model(synthetic_path("llama"), n_ctx=64, threads=2)
    steal = model.engine.runner.steal
    stolen, phases = steal.stolen_phases()
    assert stolen == phases > 0
    arenas = steal.sets[0].arenas
    spans = sorted((off, off + steal.plan.f32_sizes[key]) for key, off in arenas.offsets.items()
                   if key in steal.plan.f32_sizes)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False))
    rows = steal.sets[0].tape
    stores = rows[:, tape.OP] == tape.OP_KV_STORE
    assert stores.any() and np.all(rows[stores, tape.FLAGS] & tape.FLAG_COMMIT)
    assert not np.any(rows[~stores, tape.FLAGS] & tape.FLAG_COMMIT)
    plan = steal.plan
    norm = next(i for i, ins in enumerate(plan.instrs) if ins.op == tape.OP_RMS_NORM)
    plan.instrs[norm].op = tape.OP_LAYER_NORM  # not STEALABLE: its kernel leaves partial values in y
    try:
        flags = steal_flags(plan)
    finally:
        plan.instrs[norm].op = tape.OP_RMS_NORM
    start = norm
    while start > 0 and not plan.instrs[start - 1].column_barrier:
        start -= 1
    assert flags[start] == flags[norm] == 0 and flags[0 if start else -1] != 0
