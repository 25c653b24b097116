"""The compiled step's threads: one persistent pool of workers per process, and when to use them.

Owns: `available_cpus` (the default thread count), `Worker` (a pool thread living in compiled code,
step_drive.serve, and what it must keep alive), `run_parallel` (every thread runs the same
stretch of tape, the calling thread too, sharing each phase's work as step_sync.py describes),
`PhaseCounters` (a step's phase counters, reset with a new epoch for every stretch run) and
`Contention`, the rule that drops to one thread for a while when recent passes kept spending much
of their time waiting for a thread another process keeps off its core. Does not own the tape, the
driver (step_drive.drive) the threads run nor the mailbox's layout (step_drive.post / serve).

The calling thread returns once every share of the stretch is done; a worker still walking it then
(it was off its core) finds the next stretch's epoch in the counters and leaves without touching
anything, unless it was inside a share of a phase that may be stolen (step_sync.py, "Stealing"):
then it first finishes that share, writing bits already in place in its pass's arena. Contention
governs the passes that cannot steal (step.py runs one-row passes on every thread, stealing).
"""

from __future__ import annotations

import atexit
import os
import threading
import time

import numpy as np

from kinetic.codegen.cpu.native import FUTEX_TIMEOUT, futex_syscall, sched_yield_address
from kinetic.codegen.cpu.step_drive import (
    BOX_WORDS,
    SLEEP_SECONDS,
    STOP,
    USING,
    dispatch_words,
    drive,
    post,
    serve,
)
from kinetic.codegen.cpu.step_sync import ARRIVED, DONE, SHARES, STEAL_SPIN_CYCLES, sync_words

CONTENDED = 0.4  # a pass whose calling thread waited this share of its time at barriers was starved
STARVED_PASSES = 4  # this many starved passes among the last 8 (a lasting load, not one hiccup) ...
SOLO_SECONDS = 1.0  # ... run on one thread this long, then try all again


def available_cpus() -> int:
    """The logical CPUs this process may run on (the default thread count, as llama.cpp's -t)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Contention:
    """All threads, unless recent passes kept spending much of their time waiting for a thread that
    another process keeps off its core: then one thread for a while (spinning barriers would
    collapse), then all again. One starved pass (a hiccup) changes nothing."""

    def __init__(self, threads: int):
        self.threads = threads
        self._solo_until = 0.0
        self._starved = 0  # one bit per recent multi-threaded pass: was it starved?

    def threads_now(self) -> int:
        return 1 if time.monotonic() < self._solo_until else self.threads

    def record(self, waited: int, elapsed: int) -> None:
        """A pass on several threads: its calling thread waited `waited` of its `elapsed` cycles."""
        self._starved = (self._starved << 1 | (waited > CONTENDED * elapsed)) & 0xFF
        if bin(self._starved).count("1") >= STARVED_PASSES:
            self._solo_until = time.monotonic() + SOLO_SECONDS
            self._starved = 0


EPOCHS = 1 << 30  # epochs cycle through 1..EPOCHS (the counters' upper 32 bits)
FUTEX_NAP = np.array([0, 20_000], np.int64)  # struct timespec: 20 us, a sleeper that may take over a share
# what a waiting thread calls (step_sync.wait_or_steal): the futex, else sched_yield; then whether a
# decode phase of small ops is one share (step_drive.phase_shares) and whether a thread alone claims
# all of a stealable phase's shares (step_sync.claim_rest); 0 only in benchmarks/under_load.py
WAITS = np.array([*futex_syscall(), FUTEX_TIMEOUT.ctypes.data, sched_yield_address(), FUTEX_NAP.ctypes.data,
                  STEAL_SPIN_CYCLES, 1, 1], np.int64)
WORKER_SLEEP = np.array([0, int(SLEEP_SECONDS * 1e9)], np.int64)  # struct timespec: an idle worker's futex wait


class PhaseCounters:
    """One step's phase counters (step_sync.py's layout), one set per phase of its tape, with room
    for `threads` shares a phase, or for each phase's own count where `shares` gives them (a
    stealing tape's phases of many shares: step_steal.share_counts)."""

    def __init__(self, phases: int, threads: int, shares: np.ndarray | None = None):
        shares = np.full(phases, threads, np.int64) if shares is None else np.asarray(shares, np.int64)
        self.stride = sync_words(int(shares.max(initial=threads)))
        words = np.zeros((phases + 1) * self.stride + 8, np.int64)
        skip = (-words.ctypes.data % 64) // 8  # the first phase on a cache line
        self.words = words[skip: skip + phases * self.stride].reshape(phases, self.stride)
        base = np.arange(phases, dtype=np.int64) * self.stride
        heads = (base[:, None] + np.array([0, DONE // 8, ARRIVED // 8])).ravel()
        states = [base[p] + SHARES // 8 + 2 * np.arange(shares[p]) for p in range(phases)]
        self._reset = np.concatenate([heads, *states])  # the words a stretch starts anew (next_stretch)
        self.phases = phases
        self.epoch = 0

    def next_stretch(self) -> tuple[int, int]:
        """(the counters' address, a new epoch) with every phase's counts at zero and every share
        uncommitted under it, no thread come to it. The sleepers and the usual share lengths are
        kept (a late sleeper still leaves its count)."""
        self.epoch = self.epoch % EPOCHS + 1
        self.words.reshape(-1)[self._reset] = self.epoch << 32
        return self.words.ctypes.data, self.epoch


class Worker:
    """A pool thread that lives in compiled code (step_drive.serve): `put` posts a stretch to its
    mailbox. Between stretches it sleeps on the mailbox (futex), never in Python, so it takes no GIL
    after a stretch (the calling thread used to wait 30-350 us a token for it, ms when the worker was
    preempted holding it) nor before the next (a queue's wake, then the GIL, then drive's dispatch).
    Each posted stretch's arrays and `keep` stay referenced here until the worker has taken a later
    one (a late share may still read them)."""

    def __init__(self, number: int):
        words = np.zeros(BOX_WORDS + 8, np.int64)
        skip = (-words.ctypes.data % 64) // 8
        self.box = words[skip: skip + BOX_WORDS]  # on cache lines of its own
        self.address = self.box.ctypes.data
        self._held: dict[int, tuple] = {}
        self._gen = 0
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._serve, daemon=True, name=f"kinetic-step-{number}")
        self.thread.start()

    def _serve(self) -> None:
        """The thread's whole life (it holds self, so the mailbox outlives every reader of it)."""
        serve(self.address, WAITS, WORKER_SLEEP.ctypes.data)

    def put(self, item: tuple) -> None:
        """Post (keep, drive's arguments) to the worker."""
        _keep, dispatch = item
        words = dispatch_words(dispatch)
        with self._lock:
            self._gen += 1
            self._held[self._gen] = item
            post(self.address, words, self._gen, WAITS)
            using = int(self.box[USING])
            for gen in [g for g in self._held if g < self._gen and g != using]:
                del self._held[gen]

    def stop(self) -> None:
        """End the thread (it returns from serve) and wait for it a little."""
        with self._lock:
            post(self.address, np.zeros(0, np.int64), STOP, WAITS)
        self.thread.join(timeout=1.0)


_workers: list[Worker] = []
_lock = threading.Lock()


@atexit.register
def _stop_workers() -> None:
    """Workers leave their compiled loop before the interpreter ends (and may free that code)."""
    with _lock:
        for worker in _workers:
            worker.stop()


def _pool(n: int) -> list[Worker]:
    with _lock:
        while len(_workers) < n:
            _workers.append(Worker(len(_workers) + 1))
        return _workers[:n]


def run_parallel(tape, ftape, seg: tuple[int, int], threads: int, common: tuple, counters: PhaseCounters,
                 prof: np.ndarray, active: int = 0, keep: object = None, shares: int = 0) -> int:
    """Every thread runs tape[start:end]; when the calling thread returns, every share of it is done
    (a worker that arrives late leaves without touching anything, unless it was running a share of
    a phase that may be stolen: then it finishes that share, which repeats bits already in place, in
    the arena whose count of threads is at `active`). `keep`: what such a late share reads besides
    the tape and the arena (the pass's caches), held by each worker until it is done with the
    stretch. `shares`: a phase's shares (0: one a thread; more only for a tape without stolen
    phases). Returns the cycles the calling thread waited at the ends of phases."""
    start, end = seg
    shares = shares or threads
    sync, epoch = counters.next_stretch()
    tail = (sync, 8 * counters.stride, epoch, WAITS, active, prof)
    for tid, inbox in enumerate(_pool(threads - 1), start=1):
        inbox.put(((keep, counters), (tape, ftape, start, end, tid, threads, shares) + common + tail))
    return drive(tape, ftape, start, end, 0, threads, shares, *common, *tail)
