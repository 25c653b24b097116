"""First-run kernel compilation shown as progress: one stderr line while it lasts, nothing when cached.

Owns: `CompileProgress.shown()`, a context in which every numba compilation (numba's own
"numba:compile" event, fired only on a cache miss: a cached function loads without it) keeps one
terminal line up to date: how many functions compiled and for how long; at the end the line gives
way to one summary line. The CPU runner's compiled step functions are numba functions cached on disk
(next to their source, or in NUMBA_CACHE_DIR), and its generated kernels are object code cached under
~/.cache/kinetic/kernels (kinetic/codegen/cpu/jit.py), so only a first run compiles anything.
Shown only when stderr is a terminal: a progress line is for a person watching, and a pipe or a
log gets nothing. Does not own compiling or caching (numba, the JIT).
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager

from numba.core import event

TICK_SECONDS = 0.25


class _Counter(event.Listener):
    """Counts numba compilations as they start and end (nested ones, callees, included)."""

    def __init__(self):
        self.started = self.finished = 0
        self.first_start: float | None = None

    def on_start(self, ev) -> None:
        self.started += 1
        if self.first_start is None:
            self.first_start = time.perf_counter()

    def on_end(self, ev) -> None:
        self.finished += 1


class CompileProgress:
    def __init__(self, stream):
        self.stream = stream
        self.counter = _Counter()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="compile-progress", daemon=True)
        self._width = 0

    @classmethod
    @contextmanager
    def shown(cls, stream=None):
        stream = stream if stream is not None else sys.stderr
        if not _is_terminal(stream):
            yield None
            return
        progress = cls(stream)
        event.register("numba:compile", progress.counter)
        progress._thread.start()
        try:
            yield progress
        finally:
            event.unregister("numba:compile", progress.counter)
            progress._done.set()
            progress._thread.join()
            progress._summary()

    def _tick(self) -> None:
        shown = ""
        while not self._done.wait(TICK_SECONDS):
            if self.counter.first_start is None:
                continue
            line = (f"\rcompiling kernels for this CPU, first run only: {self.counter.finished} done, "
                    f"{time.perf_counter() - self.counter.first_start:.0f} s")
            if line != shown:
                self._write(line)
                shown = line

    def _summary(self) -> None:
        if self.counter.first_start is None:
            return  # everything came from the caches: nothing to say
        seconds = time.perf_counter() - self.counter.first_start
        if self._width:  # erase the live line
            self._write("\r" + " " * self._width + "\r")
        n = self.counter.finished
        self.stream.write(f"compiled {n} kernel{'' if n == 1 else 's'} for this CPU in {seconds:.1f} s; they are "
                          f"cached, so the next start skips this\n")
        self.stream.flush()

    def _write(self, text: str) -> None:
        self._width = max(self._width, len(text))
        self.stream.write(text)
        self.stream.flush()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
