"""The CPU work a request needs before the engine, kept off the event loop: CpuPool.

Owns: running a request's synchronous preparation (parsing a large JSON body, validating fields,
rendering the chat template, tokenizing, compiling a grammar, encoding a large response) on a few
worker threads, with bounded concurrency (large requests one at a time) and a bounded number of
requests waiting for a thread (beyond: 503); telling the work its client has gone (a cancel flag
it polls, which a template render passes to its renderer process); and handing freed memory back
to the system after large requests. Does not own what the work does (the API modules) nor
generation (the engine thread).

Each preparation gets a fresh daemon thread (a few tens of microseconds), so one still running when
the server stops does not hold up its exit. Threads are enough here because the heavy parts release
the GIL or are short: `tokenizers`' batch encoder runs in Rust without it, template rendering waits
on a renderer process, and Python-level validation yields the GIL every few milliseconds. What
still holds it is the C JSON decoder: about 0.25 s for the worst 16 MiB body (a list of small numbers), once per body.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import threading
from collections.abc import Callable
from typing import TypeVar

from anyio import to_thread

from kinetic.server.errors import ApiError

T = TypeVar("T")
Cancel = Callable[[], bool]  # polled by the work: True once its client has gone

LARGE_BYTES = 1024 * 1024  # a request at least this large hands its freed memory back afterwards


class CpuPool:
    """At most `workers` preparations of small requests and one of a large request (LARGE_BYTES or
    more) run at once, so small ones never wait behind large ones and at most one large request's
    intermediate buffers (tokenizing 16 MiB takes about 1.3 GB in `tokenizers`) exist at a time; at
    most `max_waiting` more wait for a thread."""

    def __init__(self, workers: int = 2, max_waiting: int = 16):
        self.workers = workers
        self.max_waiting = max_waiting
        self._small = asyncio.Semaphore(workers)
        self._large = asyncio.Semaphore(1)
        self.admitted = 0  # running and waiting; only touched on the event loop

    async def run(self, work: Callable[[Cancel], T], receive=None, large: bool = False) -> T:
        """work(cancel) on a worker thread. `receive`: the request's ASGI receive, watched for the
        client leaving (its body must have been read), which sets the cancel flag; a request that
        leaves while waiting for a thread never runs. `large`: take the large requests' thread,
        and trim the heap afterwards."""
        if self.admitted >= self.workers + 1 + self.max_waiting:
            raise ApiError(503, f"the server is busy: {self.admitted} requests are being prepared; try again shortly",
                           headers={"Retry-After": "1"})
        self.admitted += 1
        gone = threading.Event()
        watcher = asyncio.ensure_future(_watch_disconnect(receive, gone)) if receive is not None else None
        try:
            async with self._large if large else self._small:
                return await _on_a_daemon_thread(_call, work, gone, large)
        finally:
            gone.set()  # a call its task stopped waiting for (the server is stopping) ends at its next check
            self.admitted -= 1
            if watcher is not None:
                watcher.cancel()


class ClientGone(ApiError):
    """The client left before its request was prepared (nobody reads this answer)."""

    def __init__(self):
        super().__init__(400, "the client went away")


def _call(work: Callable[[Cancel], T], gone: threading.Event, large: bool) -> T:
    try:
        if gone.is_set():
            raise ClientGone()
        return work(gone.is_set)
    finally:
        if large:
            release_memory()


async def _on_a_daemon_thread(fn: Callable[..., T], *args) -> T:
    """fn(*args) on a new daemon thread: a preparation still running when the server stops (a long
    tokenization cannot be interrupted) never holds up the process's exit, as a pool thread would."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def settle(result, error) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def target() -> None:
        try:
            outcome = (fn(*args), None)
        except BaseException as e:  # handed to the waiting task, which raises it
            outcome = (None, e)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:
            pass  # the event loop has closed: nobody is waiting
        outcome = None  # this frame is in the error's traceback: holding the error would make a cycle

    threading.Thread(target=target, name="kinetic-prepare", daemon=True).start()
    return await future


async def _watch_disconnect(receive, gone: threading.Event) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return


class ReleaseAfterLarge:
    """ASGI middleware: once a request of LARGE_BYTES or more is answered (or refused) and its
    objects are dropped, collect the cycles that still hold them and trim the heap, on a thread."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        try:
            await self.app(scope, receive, send)
        finally:
            if scope["type"] == "http" and _declared_length(scope) >= LARGE_BYTES:
                await to_thread.run_sync(release_memory, True)


def _declared_length(scope) -> int:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0


def _malloc_trim():
    """glibc's malloc_trim, or None elsewhere (musl, macOS, Windows)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def release_memory(collect: bool = False) -> None:
    """Hand the heap's free pages back to the system. glibc keeps memory freed by a worker thread in
    that thread's arena, so without this the resident size stays at the high-water mark of the
    largest request each worker ever prepared. collect: first free what only reference cycles hold
    (a refused request's traceback keeps its frames, and with them its body, until the collector runs).
    Only the young generations are collected: the request's cycles are young, while a full collection
    holds the GIL for as long as everything the process holds takes to walk (over a second in a large
    process), stalling every stream and /health."""
    if collect:
        gc.collect(1)
    if _TRIM is not None:
        _TRIM(0)
