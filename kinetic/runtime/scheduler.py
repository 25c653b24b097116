"""The scheduler: the queue of answers waiting for the engine, the slots of the answers running, and
the thread that runs their passes (Convoy: continuous batching).

Owns: admission (at most `max_queued` requests waiting; beyond that `SchedulerBusy`, with the
seconds after which a retry likely finds room: `retry_after`), the slots
(at most `slots` answers run at once, on a device that batches several sequences per pass; one on
a device that does not: Capabilities.max_sequences), the pass loop (each pass, the running answers'
rows chosen by kinetic/runtime/convoy.py run together through Engine.run; a request waiting for a
slot takes the first one free, in arrival order), cancellation (a ticket cancelled while it waits
never runs; while it runs, its answer leaves at the next pass), what every slot runs now or ran
last (llama-server's /slots), and the counters since start (its /metrics). Events of a running
ticket go to the `post` callback its submitter gave, from the scheduler's thread: Piece events,
then one Finished or Failed.
Does not own: what an answer is (generation.py), which rows share a pass (convoy.py), HTTP or event
loops (the server turns `post` into an asyncio queue), nor what a request field means.

Exactness: every answer is bit for bit what it is alone, whatever shares its passes (Engine.run and
batch invariance; tests/runtime/test_convoy.py).
"""

from __future__ import annotations

import itertools
import logging
import math
import queue
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from kinetic.errors import KineticError
from kinetic.runtime.convoy import PassBudget, compose
from kinetic.runtime.engine import SeqRows, Sequence
from kinetic.runtime.generation import Finished, Generation, GenerationRequest, Generator
from kinetic.runtime.kv_cache import available_memory
from kinetic.runtime.warm import common_prefix

log = logging.getLogger("kinetic.runtime")

DEFAULT_SLOTS = 4  # --parallel's default
RETRY_AFTER_MAX_S = 60  # the longest Retry-After a busy scheduler suggests


class SchedulerBusy(KineticError):
    """Too many requests are already waiting for the engine; `retry_after`: seconds after which a
    retry likely finds room."""

    def __init__(self, message: str, hint: str, retry_after: int):
        super().__init__(message, hint)
        self.retry_after = retry_after


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
    n_decode_total: int = 0  # engine passes (each shared by the answers in it)
    n_tokens_max: int = 0
    prompt_tokens_cached_total: int = 0  # prompt tokens reused rather than computed (Warm Start)

    requests_finished: int = 0  # answers that ended (Retry-After's mean duration)
    draft_sources: dict[str, list[int]] = field(default_factory=dict)  # RAD-1: drafter -> [guessed, kept]

    def count(self, done: Finished) -> None:
        self.requests_finished += 1
        self.prompt_tokens_total += done.held_tokens - done.cached_tokens  # those that ran, as llama-server counts
        self.prompt_tokens_cached_total += done.cached_tokens
        self.prompt_seconds_total += done.prompt_seconds
        self.tokens_predicted_total += done.generated_tokens
        self.tokens_predicted_seconds_total += done.generate_seconds
        self.n_tokens_max = max(self.n_tokens_max, done.prompt_tokens + done.generated_tokens)
        for source, (guessed, kept) in done.draft_sources.items():
            totals = self.draft_sources.setdefault(source, [0, 0])
            totals[0], totals[1] = totals[0] + guessed, totals[1] + kept


class Ticket:
    """One submitted request: its cancellation flag, and once it runs its slot, its Generation and
    the rows it wants in the next pass."""

    _ids = itertools.count(1)

    def __init__(self, request: GenerationRequest, post: Callable[[object], None]):
        self.id = next(Ticket._ids)
        self.request = request
        self.post = post
        self.cancelled = threading.Event()
        self.slot = -1
        self.running = False  # in a slot now (guarded by the scheduler's lock)
        self.generation: Generation | None = None
        self.steps: Iterator | None = None
        self.want: SeqRows | None = None

    @property
    def n_decoded(self) -> int:
        return self.generation.n_decoded if self.generation else 0

    @property
    def n_prompt_processed(self) -> int:
        return self.generation.n_prompt_processed if self.generation else 0

    @property
    def decoding(self) -> bool:
        return self.n_decoded > 0


class Scheduler:
    """Runs submitted requests on one thread, `slots` at a time sharing passes. submit() from any
    thread; the rest runs on the thread. One slot: one answer at a time, in arrival order."""

    def __init__(self, generator: Generator, max_queued: int = 32, slots: int | None = 1,
                 prompt_rows: int | None = None):
        """`slots` None: DEFAULT_SLOTS, fewer when their caches would not fit in memory."""
        engine = generator.engine
        self.generator = generator
        self.max_queued = max_queued
        limit = engine.max_sequences
        wanted = slots if slots is not None else max(1, min(DEFAULT_SLOTS, self._fitting(engine)))
        self.slots = wanted if limit is None else max(1, min(wanted, limit))
        self.budget = PassBudget(prompt_rows or engine.batch, engine.max_rows)
        self.counters = Counters()
        self.lock = threading.Lock()  # guards counters and slot_tickets
        self.slot_tickets: list[Ticket | None] = [None] * self.slots  # running now, else the last run
        # the sequence each slot holds: its last answer's, continued by the next (Warm Start cuts it
        # back to what the new prompt shares; without Warm Start it starts empty)
        self._sequences: list[Sequence | None] = [None] * self.slots
        self._active: list[Ticket] = []  # the engine thread's own: running tickets, in arrival order
        self._queue: queue.Queue[Ticket | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._prefills: list[Ticket] = []  # Zero Wait's prefills not yet superseded (guarded by `lock`)

    @staticmethod
    def _cache_bytes(engine) -> int:
        """One sequence's KV cache."""
        return 2 * engine.n_ctx * sum(engine.kv_width.values()) * np.dtype(engine.kv_dtype).itemsize

    @staticmethod
    def _fitting(engine) -> int:
        """Caches that fit in the memory available now."""
        free = available_memory()
        return DEFAULT_SLOTS if free is None else free // max(Scheduler._cache_bytes(engine), 1)

    def check_memory(self) -> None:
        """Refuse slots whose caches would not all fit in memory (a clear message at start)."""
        engine = self.generator.engine
        need = self.slots * self._cache_bytes(engine)
        free = available_memory()
        if free is not None and need > free:
            raise KineticError(
                f"{self.slots} slots of {engine.n_ctx} tokens need {need / 1024**3:.1f} GiB for their KV caches, "
                f"more than the {free / 1024**3:.1f} GiB of memory available",
                "Use fewer slots (--parallel N) or a smaller context (-c N).")

    def start(self) -> None:
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="kinetic-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Cancels the running tickets and ends the thread (waiting at most `timeout` seconds)."""
        if self._thread is not None:
            self._stopping = True
            with self.lock:
                for ticket in self.slot_tickets:
                    if ticket is not None:
                        ticket.cancelled.set()
            self._queue.put(None)
            self._thread.join(timeout=timeout)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot (llama-server's requests_deferred); one cancelled while it
        waits no longer counts (it leaves the queue unrun when a slot frees)."""
        with self._queue.mutex:
            return sum(t is not None and not t.cancelled.is_set() for t in self._queue.queue)

    def retry_after(self) -> int:
        """Seconds until the queue likely has room: the answers ahead of a new request, slots at a
        time, at the mean duration of the answers so far (1 before any has finished), 1..60."""
        with self.lock:
            c = self.counters
            done = c.requests_finished
            mean = (c.prompt_seconds_total + c.tokens_predicted_seconds_total) / done if done else 1.0
        rounds = (self.waiting + self.slots) / self.slots
        return max(1, min(RETRY_AFTER_MAX_S, math.ceil(mean * rounds)))

    @property
    def processing(self) -> int:
        """Requests running now (llama-server's requests_processing); read under `lock`."""
        return sum(t is not None and t.running for t in self.slot_tickets)

    def submit(self, request: GenerationRequest, post: Callable[[object], None]) -> Ticket:
        waiting = self.waiting
        if waiting >= self.max_queued:
            raise SchedulerBusy(f"the server is busy: every slot is answering and {waiting} requests are already "
                                "waiting", "Try again shortly.", self.retry_after())
        ticket = Ticket(request, post)
        if request.prefill_only:  # Zero Wait: a newer prefill replaces the ones before it
            with self.lock:
                for older in self._prefills:
                    older.cancelled.set()
                self._prefills = [ticket]
        self._queue.put(ticket)
        return ticket

    # ---- the engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while self._admit():
            if self._active:
                self._pass()
        for ticket in list(self._active):  # stopping: each cancelled answer ends with its Finished
            ticket.cancelled.set()
            self._guarded(ticket, self._advance)

    def _admit(self) -> bool:
        """Starts waiting tickets while a slot is free (waits for one when nothing runs). False: stop.
        A request that comes in ends the running prefills first (Zero Wait gives way after the pass
        it is in; what it ran stays in its slot, which the request then takes, and in Warm Start's store)."""
        if self._queue.qsize():
            for ticket in [t for t in self._active if t.request.prefill_only]:
                ticket.cancelled.set()
                self._guarded(ticket, self._advance)
        while len(self._active) < self.slots and not self._stopping:
            try:
                ticket = self._queue.get(block=not self._active)
            except queue.Empty:
                break
            if ticket is None:
                break
            if not ticket.cancelled.is_set():
                self._start(ticket)
        return not self._stopping

    def _start(self, ticket: Ticket) -> None:
        taken = {t.slot for t in self._active}
        free = [i for i in range(self.slots) if i not in taken]
        ticket.slot = max(free, key=lambda i: (self._shared(i, ticket.request.prompt), -i))
        with self.lock:
            self.slot_tickets[ticket.slot] = ticket
            ticket.running = True
            self.counters.requests_total += 1
        self._active.append(ticket)
        self._guarded(ticket, self._begin)

    def _shared(self, slot: int, prompt: tuple[int, ...]) -> int:
        """Leading tokens the slot's sequence shares with a prompt (the slot a request reuses best)."""
        seq = self._sequences[slot]
        if seq is None or self.generator.warm is None:
            return 0
        return common_prefix(np.asarray(seq.tokens, np.int32), np.asarray(prompt, np.int32))

    def _begin(self, ticket: Ticket) -> None:
        engine = self.generator.engine
        seq = self._sequences[ticket.slot]
        if seq is None:
            seq = self._sequences[ticket.slot] = engine.new_sequence()
        if self.generator.warm is None:
            engine.rollback(seq, 0)
        ticket.generation = self.generator.generate(ticket.request, ticket.cancelled, sequence=seq)
        ticket.steps = ticket.generation.steps()
        self._advance(ticket)

    def _pass(self) -> None:
        """One pass: the parts convoy.compose picks run together, then each of them moves on."""
        for ticket in [t for t in self._active if t.cancelled.is_set()]:
            self._guarded(ticket, self._advance)  # leaves without its rows running (generation.py)
        for ticket in list(self._active):
            self._guarded(ticket, lambda t: t.want.seq.cache.check_room(len(t.want.rows.tokens)))
        chosen = compose(self._active, self.budget)
        if not chosen:
            return
        # RAD-1 prices guesses by the answers they slow down (drafting.DraftPolicy._gate)
        self.generator.decoder.costs.company = max(1, sum(t.decoding for t in chosen))
        try:
            self.generator.engine.run([t.want for t in chosen])
        except Exception as e:  # every answer of the pass fails; the scheduler goes on
            for ticket in chosen:
                self._fail(ticket, e)
            return
        with self.lock:
            self.counters.n_decode_total += 1
        for ticket in chosen:
            ticket.want = None
            self._guarded(ticket, self._advance)

    def _advance(self, ticket: Ticket) -> None:
        """Runs the ticket's answer up to the rows of its next pass, posting its events; done when
        the answer ends."""
        self._bound_prompt(ticket)
        for event in ticket.steps:
            if isinstance(event, SeqRows):
                ticket.want = event
                return
            if isinstance(event, Finished):
                with self.lock:
                    self.counters.count(event)
            ticket.post(event)
        self._leave(ticket)

    def _bound_prompt(self, ticket: Ticket) -> None:
        """Convoy's prompt bound on the ticket's next pass (convoy.py): beside other running answers
        its prompt takes at most the budget's prompt rows a pass (one grid chunk by default, so the
        others wait at most that); alone, the engine's prompt passes (Engine.prompt_pass)."""
        seq = self._sequences[ticket.slot] if ticket.slot >= 0 else None
        if seq is None:
            return
        alone = all(t is ticket for t in self._active)
        seq.prompt_pass = None if alone else min(self.generator.engine.prompt_pass, self.budget.prompt_rows)

    def _guarded(self, ticket: Ticket, step: Callable[[Ticket], None]) -> None:
        """Runs one step of a ticket; an error fails that ticket alone."""
        try:
            step(ticket)
        except Exception as e:  # reported to the ticket's submitter (logged if a bug)
            self._fail(ticket, e)

    def _fail(self, ticket: Ticket, error: Exception) -> None:
        if isinstance(error, KineticError):
            ticket.post(Failed(error.message))
        else:  # a bug: logged with its traceback, the caller gets a clean failure
            log.error("internal error in the engine:\n%s", "".join(traceback.format_exception(error)))
            ticket.post(Failed(f"internal error: {type(error).__name__}", internal=True))
        if ticket.steps is not None:
            ticket.steps.close()
        self._leave(ticket)

    def _leave(self, ticket: Ticket) -> None:
        ticket.want, ticket.steps = None, None
        with self.lock:
            ticket.running = False
        if ticket in self._active:
            self._active.remove(ticket)
