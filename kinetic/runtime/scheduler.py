"""The scheduler: the queue of answers waiting for the engine, and the thread that runs them.

Owns: admission (at most `max_queued` requests waiting; beyond that `SchedulerBusy`), the order
they run in (one at a time, in arrival order: the multi-user pass that Convoy brings lands here),
cancellation (a ticket cancelled while it waits never runs; while it runs, the generation loop
stops within one pass), the ticket running now and the last one (llama-server's /slots), and the
counters since start (its /metrics). Events of a running ticket go to the `post` callback its
submitter gave, from the scheduler's thread: Piece events, then one Finished or Failed.
Does not own: what an answer is (generation.py), HTTP or event loops (the server turns `post` into
an asyncio queue), nor what a request field means.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from kinetic.errors import KineticError
from kinetic.runtime.generation import Finished, Generation, GenerationRequest, Generator

log = logging.getLogger("kinetic.runtime")


class SchedulerBusy(KineticError):
    """Too many requests are already waiting for the engine."""


@dataclass
class Failed:
    """The answer could not be generated: a request the engine refuses (`internal` False: the
    caller's fault, such as bad sampling settings) or a bug (`internal` True, logged)."""

    message: str
    internal: bool = False


@dataclass
class Counters:
    """llama-server's /metrics counters (since start) and the gauges' inputs."""

    requests_total: int = 0
    prompt_tokens_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    n_decode_total: int = 0  # engine passes: prompt chunks, decode steps, drafted verifications
    n_tokens_max: int = 0

    def count(self, done: Finished) -> None:
        self.prompt_tokens_total += done.prompt_tokens
        self.prompt_seconds_total += done.prompt_seconds
        self.tokens_predicted_total += done.generated_tokens
        self.tokens_predicted_seconds_total += done.generate_seconds
        self.n_decode_total += done.passes
        self.n_tokens_max = max(self.n_tokens_max, done.prompt_tokens + done.generated_tokens)


class Ticket:
    """One submitted request: its cancellation flag, and its Generation once it runs."""

    _ids = itertools.count(1)

    def __init__(self, request: GenerationRequest, post: Callable[[object], None]):
        self.id = next(Ticket._ids)
        self.request = request
        self.post = post
        self.cancelled = threading.Event()
        self.generation: Generation | None = None

    @property
    def n_decoded(self) -> int:
        return self.generation.n_decoded if self.generation else 0

    @property
    def n_prompt_processed(self) -> int:
        return self.generation.n_prompt_processed if self.generation else 0


class Scheduler:
    """Runs submitted requests on one thread. submit() from any thread; the rest runs on the thread."""

    def __init__(self, generator: Generator, max_queued: int = 32):
        self.generator = generator
        self.max_queued = max_queued
        self.counters = Counters()
        self.lock = threading.Lock()  # guards counters, current and last
        self.current: Ticket | None = None
        self.last: Ticket | None = None
        self._queue: queue.Queue[Ticket | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kinetic-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Cancels the running ticket and ends the thread (waiting at most `timeout` seconds)."""
        if self._thread is not None:
            with self.lock:
                if self.current is not None:
                    self.current.cancelled.set()
            self._queue.put(None)
            self._thread.join(timeout=timeout)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def waiting(self) -> int:
        return self._queue.qsize()

    def submit(self, request: GenerationRequest, post: Callable[[object], None]) -> Ticket:
        if self._queue.qsize() >= self.max_queued:
            raise SchedulerBusy(f"the server is busy: {self._queue.qsize()} requests are already waiting",
                                "Try again shortly.")
        ticket = Ticket(request, post)
        self._queue.put(ticket)
        return ticket

    def _run(self) -> None:
        while True:
            ticket = self._queue.get()
            if ticket is None:
                return
            if ticket.cancelled.is_set():
                continue
            with self.lock:
                self.current = ticket
                self.counters.requests_total += 1
            try:
                self._answer(ticket)
            except KineticError as e:
                ticket.post(Failed(e.message))
            except Exception as e:  # a bug: logged with its traceback, the caller gets a clean failure
                log.error("internal error in the engine:\n%s", "".join(traceback.format_exception(e)))
                ticket.post(Failed(f"internal error: {type(e).__name__}", internal=True))
            finally:
                with self.lock:
                    self.current, self.last = None, ticket

    def _answer(self, ticket: Ticket) -> None:
        ticket.generation = self.generator.generate(ticket.request, ticket.cancelled)
        for event in ticket.generation:
            if isinstance(event, Finished):
                with self.lock:
                    self.counters.count(event)
            ticket.post(event)
