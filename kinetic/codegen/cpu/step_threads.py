"""The compiled step's threads: one persistent pool of workers per process, and when to use them.

Owns: `available_cpus` (the default thread count), `run_parallel` (every thread runs the same
stretch of tape, the calling thread too) and `Contention`, the rule that drops to one thread for
a while when the machine's other load keeps starving the spinning barriers. Does not own the tape
nor the driver (step_ops.drive) the threads run.
"""

from __future__ import annotations

import os
import queue
import threading
import time

from kinetic.codegen.cpu.step_ops import drive

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


_workers: list[queue.SimpleQueue] = []
_lock = threading.Lock()


def _worker(inbox: queue.SimpleQueue) -> None:
    while True:
        drive(*inbox.get())


def _pool(n: int) -> list[queue.SimpleQueue]:
    with _lock:
        while len(_workers) < n:
            inbox = queue.SimpleQueue()
            threading.Thread(target=_worker, args=(inbox,), daemon=True,
                             name=f"kinetic-step-{len(_workers) + 1}").start()
            _workers.append(inbox)
        return _workers[:n]


def run_parallel(tape, ftape, seg: tuple[int, int], threads: int, common: tuple) -> int:
    """Every thread runs tape[start:end]; the tape's closing barrier means that when the calling
    thread returns, the workers have finished their shares too (they touch nothing after it).
    Returns the cycles the calling thread waited at barriers."""
    start, end = seg
    for tid, inbox in enumerate(_pool(threads - 1), start=1):
        inbox.put((tape, ftape, start, end, tid, threads) + common)
    return drive(tape, ftape, start, end, 0, threads, *common)
