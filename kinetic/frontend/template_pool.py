"""Renderer processes for chat templates: a small pool kept warm, every render under an enforced budget.

Owns: RenderBudget (wall clock, output size, memory), starting renderer processes
(template_worker.py), handing one request at a time to an idle one, waiting for its answer with a
deadline and a cancel check, and killing it when the deadline passes or the caller cancels (or
every renderer at exit). Does not own the sandbox (template_sandbox.py), the limits a renderer sets
on itself (template_worker.py), or the messages users read (chat.py).

Why a process and not a metering sandbox: a template is untrusted code, and the ways it can ask for
memory or time are many (`%` and str.format widths, center, indent, format, tojson indent, `~`
doubling through namespace(), nested loops, strftime widths, ...). A sandbox that meters operations
is only as good as its list, and each missed entry is a crashed or frozen server. A process limit is
complete by construction: whatever the template does, the kernel refuses memory past RLIMIT_AS,
its timer interrupts it, and past the deadline (plus GRACE_S) the parent kills it. The cost is a
pipe round trip per render (a fraction of a millisecond) and about 25 MB per warm renderer; at most
MAX_RENDERERS run at once. Messages are JSON both ways: a template that escaped the sandbox would
still only be able to send text back.
"""

from __future__ import annotations

import atexit
import json
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kinetic.errors import KineticError

MAX_RENDERERS = 2  # renderer processes at once; more renders wait for one to be free
POLL_S = 0.05  # how often a waiting caller checks its cancel function
GRACE_S = 1.0  # past the budget, how long the renderer's own timer has before the parent kills it
START_S = 30.0  # how long a new renderer may take to import Jinja
WAIT_FOR_RENDERER_S = 30.0  # how long a render waits for a free renderer
_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding the kinetic package
_COMMAND = (sys.executable, "-I", "-c",
            f"import sys; sys.path.insert(0, {_ROOT!r}); from kinetic.frontend.template_worker import main; main()")

Cancel = Callable[[], bool]  # polled while waiting: True (or an exception it raises) stops the render


@dataclass(frozen=True)
class RenderBudget:
    """What one render may use: wall-clock seconds, output characters, memory bytes beyond the
    renderer's own (about 25 MB)."""

    timeout_s: float = 2.0
    max_output_chars: int = 16 * 1024 * 1024
    max_memory_bytes: int = 512 * 1024 * 1024

    def __post_init__(self):
        for name in ("timeout_s", "max_output_chars", "max_memory_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise KineticError(f"the template budget's {name} must be a positive number, not {value!r}",
                                   "Example: --template-timeout 2")

    def request(self, source: str, context: dict | None) -> dict:
        return {"source": source, "context": context, "timeout_s": self.timeout_s,
                "max_output_chars": self.max_output_chars, "max_memory_bytes": self.max_memory_bytes}

    @property
    def max_answer_bytes(self) -> int:
        return 6 * self.max_output_chars + 65536  # JSON writes a control character as 6 bytes


DEFAULT_BUDGET = RenderBudget()


class RenderCancelled(KineticError):
    """The caller cancelled the render (its client left, say)."""


class _Stopped(Exception):
    """The renderer closed its channel: it exited or was killed."""


class _Renderer:
    """One renderer process and its two pipes."""

    def __init__(self):
        self.process = subprocess.Popen(_COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, bufsize=0)
        self._poll = select.poll()  # poll, not select: descriptors past 1024 in a busy server
        self._poll.register(self.process.stdout.fileno(), select.POLLIN)
        self.started = False

    def send(self, data: bytes) -> None:
        """One frame; the renderer is idle, so it reads as fast as this writes."""
        view = memoryview(len(data).to_bytes(4, "big") + data)
        try:
            while view:  # a signal can cut a pipe write short
                view = view[self.process.stdin.write(view):]
        except (BrokenPipeError, ValueError):
            raise _Stopped() from None

    def receive(self, deadline: float, cancel: Cancel | None, max_bytes: int) -> dict | None:
        """The next answer; None if the deadline passed first."""
        header = self._read(4, deadline, cancel)
        if header is None:
            return None
        size = int.from_bytes(header, "big")
        if size > max_bytes:
            raise _Stopped()
        data = self._read(size, deadline, cancel)
        if data is None:
            return None
        try:
            answer = json.loads(data.decode("utf-8", "surrogatepass"))
        except ValueError:
            raise _Stopped() from None
        if not isinstance(answer, dict):
            raise _Stopped()
        return answer

    def _read(self, size: int, deadline: float, cancel: Cancel | None) -> bytes | None:
        chunks, left = [], size
        while left:
            if not self._readable(deadline, cancel):
                return None
            chunk = self.process.stdout.read(min(left, 1 << 20))
            if not chunk:
                raise _Stopped()
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _readable(self, deadline: float, cancel: Cancel | None) -> bool:
        while True:
            if cancel is not None and cancel():
                raise RenderCancelled("the chat template render was cancelled")
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._poll.poll(1000 * min(left, POLL_S)):
                return True

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            pipe.close()


class RenderPool:
    """At most `size` renderer processes, kept warm between renders."""

    def __init__(self, size: int = MAX_RENDERERS):
        self.size = size
        self._idle: list[_Renderer] = []
        self._all: set[_Renderer] = set()
        self._lock = threading.Condition()
        self.peak_rss_bytes = 0  # the largest resident set any renderer reported

    def run(self, request: bytes, budget: RenderBudget, cancel: Cancel | None = None) -> dict:
        """The renderer's answer to one request, or a failure record for a timeout or a stopped renderer."""
        renderer = self._acquire(cancel)
        keep = False
        try:
            renderer.send(request)
            answer = renderer.receive(time.monotonic() + budget.timeout_s + GRACE_S, cancel,
                                      budget.max_answer_bytes)
            if answer is None:
                return {"error": "timeout", "message": "", "line": None}
            if isinstance(answer.get("peak_rss_bytes"), int):
                self.peak_rss_bytes = max(self.peak_rss_bytes, answer["peak_rss_bytes"])
            keep = not answer.get("retire")
            return answer
        except _Stopped:
            return {"error": "stopped", "message": _exit_status(renderer), "line": None}
        finally:
            self._release(renderer, keep)

    def pids(self) -> list[int]:
        """The process ids of the renderers now running (busy or idle)."""
        with self._lock:
            return sorted(renderer.process.pid for renderer in self._all)

    def shutdown(self) -> None:
        """Kill every renderer now; a render in progress ends with a "stopped" failure. Later renders
        start fresh renderers."""
        with self._lock:
            idle, busy = self._idle, self._all.difference(self._idle)
            self._idle, self._all = [], set()
        for renderer in busy:
            renderer.process.kill()  # the thread using it reaps it
        for renderer in idle:
            renderer.kill()

    def _acquire(self, cancel: Cancel | None) -> _Renderer:
        renderer = self._take(cancel)
        if renderer.started:
            return renderer
        try:
            ready = renderer.receive(time.monotonic() + START_S, cancel, 1024)
        except _Stopped:
            ready = None
        except BaseException:
            self._release(renderer, keep=False)
            raise
        if not (ready or {}).get("ready"):
            status = _exit_status(renderer)
            self._release(renderer, keep=False)
            raise KineticError(f"the chat template renderer did not start ({status})",
                               f"Check that `{sys.executable} -c 'import jinja2'` works.")
        renderer.started = True
        return renderer

    def _take(self, cancel: Cancel | None) -> _Renderer:
        deadline = time.monotonic() + WAIT_FOR_RENDERER_S
        with self._lock:
            while True:
                while self._idle:
                    renderer = self._idle.pop()
                    if renderer.alive():
                        return renderer
                    self._all.discard(renderer)
                    renderer.kill()  # reaps the exited process
                if len(self._all) < self.size:
                    renderer = _start_renderer()
                    self._all.add(renderer)
                    return renderer
                if cancel is not None and cancel():
                    raise RenderCancelled("the chat template render was cancelled")
                if time.monotonic() > deadline:
                    raise KineticError("every chat template renderer stayed busy", "Try again in a moment.")
                self._lock.wait(POLL_S)

    def _release(self, renderer: _Renderer, keep: bool) -> None:
        with self._lock:
            keep = keep and renderer in self._all
            if keep:
                self._idle.append(renderer)
            else:
                self._all.discard(renderer)
            self._lock.notify()
        if not keep:
            renderer.kill()


def _start_renderer() -> _Renderer:
    try:
        return _Renderer()
    except OSError as exc:  # no processes or descriptors left
        raise KineticError(f"cannot start the chat template renderer: {exc.strerror or exc}",
                           "Try again once the system has processes and file descriptors to spare.") from None


def _exit_status(renderer: _Renderer) -> str:
    try:
        code = renderer.process.wait(0.5)  # its channel closed: it is exiting, if not gone already
    except subprocess.TimeoutExpired:
        return "it stopped answering"
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


POOL = RenderPool()
atexit.register(POOL.shutdown)
