"""The server's side of the engine: a request's events brought back to the event loop.

Owns: `Job` (one request's channel: Piece events, then one Finished or Failed with its HTTP status,
fed from the engine thread through call_soon_threadsafe, so the loop never waits on the engine) and
`EngineWorker`, the app's handle on the runtime's Scheduler (kinetic/runtime/scheduler.py: the
queue, the slots whose answers share each pass (--parallel), the engine thread, cancellation, the
counters /metrics and /slots report) and on the model's GrammarCache. Does not own generation
(kinetic/runtime/generation.py: prefill, sampling, stop strings, log-probabilities), HTTP, response
shapes or what a field means (the API modules build a GenerationRequest).

A job is cancelled when its client goes away: its answer leaves the passes at the next one, so a
disconnect frees its slot within one pass.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from kinetic.runtime import scheduler
from kinetic.runtime.generation import Finished, GenerationRequest, Piece, TokenInfo
from kinetic.runtime.scheduler import Scheduler, SchedulerBusy, Ticket
from kinetic.server.constraints import GrammarCache
from kinetic.server.errors import ApiError

__all__ = ["EngineWorker", "Failed", "Finished", "GenerationRequest", "Job", "Piece", "TokenInfo"]


@dataclass
class Failed:
    status: int
    message: str


class Job:
    """One submitted request and the channel its events come back through."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._events: asyncio.Queue = asyncio.Queue()
        self.ticket: Ticket | None = None

    @property
    def request(self) -> GenerationRequest:
        return self.ticket.request

    @property
    def cancelled(self):
        return self.ticket.cancelled

    def post(self, event) -> None:
        """From the engine thread: hand an event to the event loop (dropped if the loop has closed)."""
        if isinstance(event, scheduler.Failed):
            event = Failed(500 if event.internal else 400, event.message)
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:
            self.ticket.cancelled.set()

    async def events(self):
        """Piece events, then one Finished or Failed. Leaving early (a client went away) cancels the job."""
        try:
            while True:
                event = await self._events.get()
                yield event
                if isinstance(event, (Finished, Failed)):
                    return
        finally:
            self.ticket.cancelled.set()

    async def result(self) -> tuple[str, list[TokenInfo], Finished]:
        """The whole answer: (text, tokens, Finished); a Failed event raises its ApiError."""
        text: list[str] = []
        tokens: list[TokenInfo] = []
        async for event in self.events():
            if isinstance(event, Piece):
                text.append(event.text)
                tokens.extend(event.tokens)
            elif isinstance(event, Failed):
                raise ApiError(event.status, event.message)
            else:
                return "".join(text), tokens, event
        raise ApiError(500, "the answer ended without a result")


class EngineWorker:
    """The model's scheduler as the app sees it. submit() from the event loop."""

    def __init__(self, model, max_queued: int = 32, slots: int | None = 1):
        """`slots`: answers that run at once (None: the scheduler's default; fewer on a device that
        batches fewer sequences); their caches must fit in memory, else a KineticError says so now."""
        self.model = model
        self.scheduler = Scheduler(model.generator, max_queued=max_queued, slots=slots)
        self.scheduler.check_memory()
        self.grammars = GrammarCache(model)  # the vocabulary is built on the first constrained request

    def start(self) -> None:
        self.scheduler.start()

    def stop(self) -> None:
        self.scheduler.stop()

    @property
    def running(self) -> bool:
        return self.scheduler.running

    @property
    def deferred(self) -> int:
        return self.scheduler.waiting

    @property
    def lock(self):
        """Guards counters and the slots."""
        return self.scheduler.lock

    @property
    def counters(self):
        return self.scheduler.counters

    @property
    def processing(self) -> int:
        """Answers running now; read under `lock`."""
        return self.scheduler.processing

    def slots(self) -> list[tuple[Ticket | None, bool]]:
        """Every slot: (the ticket it runs now or ran last, whether it runs one now)."""
        with self.lock:
            return [(t, t is not None and t.running) for t in self.scheduler.slot_tickets]

    def submit(self, request: GenerationRequest) -> Job:
        job = Job(asyncio.get_running_loop())
        try:
            job.ticket = self.scheduler.submit(request, job.post)
        except SchedulerBusy as e:  # llama-server queues without bound; Ollama answers 503 (OLLAMA_MAX_QUEUE)
            raise ApiError(503, f"{e.message}; try again in {e.retry_after} s",
                           headers={"Retry-After": str(e.retry_after)}) from None
        return job
