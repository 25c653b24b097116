"""The engine thread: one model, one request at a time, in arrival order.

Owns: the queue of generation jobs, the loop that runs each (prefill, then the model's RAD-1
decoder picking through the Sampler, so the tokens are plain decoding's), stop strings,
log-probabilities, cancellation, and the counters /metrics and /slots report. Tokens flow back to
the event loop as Piece events through an asyncio queue fed with call_soon_threadsafe, so the loop
never waits on the engine. Does not own HTTP, response
shapes or what a field means (the API modules build a GenerationRequest).

A job is cancelled when its client goes away: the flag is checked between prompt chunks and after
every token, so a disconnect frees the engine within one pass. A job with a grammar (compiled by the
handler, constraints.py) picks through a ConstrainedSampler and ends once the grammar allows
nothing more; the worker keeps the model's GrammarCache.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from kinetic.errors import KineticError
from kinetic.grammar import ConstrainedSampler, GrammarMatcher
from kinetic.runtime.sampling import Sampler, SamplingSettings, log_softmax, top_logprobs
from kinetic.server.constraints import GrammarCache
from kinetic.server.errors import ApiError
from kinetic.server.textstream import HoldBack

log = logging.getLogger("kinetic.server")


@dataclass(frozen=True)
class GenerationRequest:
    """What the engine needs for one answer; built and validated by the API modules."""

    prompt: tuple[int, ...]
    settings: SamplingSettings
    max_tokens: int | None = None  # None: until the answer ends or the context is full
    stop: tuple[str, ...] = ()  # stop strings, matched on the text; never sent
    logprobs: bool = False  # record each token's log-probability
    top_logprobs: int = 0  # and this many alternatives (0..20)
    ignore_eos: bool = False
    keep_special: bool = False  # keep control tokens' text (tool-call markers such as [TOOL_CALLS])
    grammar: GrammarMatcher | None = None  # hold the answer to this grammar


@dataclass(frozen=True)
class TokenInfo:
    id: int
    piece: bytes  # the token's own bytes, control tokens included
    logprob: float | None = None
    top: tuple[tuple[int, bytes, float], ...] = ()  # (id, piece, logprob), likeliest first


@dataclass
class Piece:
    """Text that can go to the client now, and the tokens it came from."""

    text: str
    tokens: list[TokenInfo]


@dataclass
class Finished:
    finish_reason: str  # "stop" (end of turn, a stop string, or the grammar's end) or "length"
    stop_type: str  # llama-server's: "eos", "word" or "limit"
    stopping_word: str
    prompt_tokens: int
    generated_tokens: int
    tokens: list[int]
    prompt_seconds: float
    generate_seconds: float
    settings: SamplingSettings


@dataclass
class Failed:
    status: int
    message: str


class Job:
    """One queued request and the channel its events come back through."""

    _ids = itertools.count(1)

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop):
        self.id = next(Job._ids)
        self.request = request
        self.cancelled = threading.Event()
        self._loop = loop
        self._events: asyncio.Queue = asyncio.Queue()
        # what /slots shows of the current or last request
        self.n_decoded = 0
        self.n_prompt_processed = 0

    def post(self, event) -> None:
        """From the engine thread: hand an event to the event loop (dropped if the loop has closed)."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:
            self.cancelled.set()

    async def events(self):
        """Piece events, then one Finished or Failed. Leaving early (a client went away) cancels the job."""
        try:
            while True:
                event = await self._events.get()
                yield event
                if isinstance(event, (Finished, Failed)):
                    return
        finally:
            self.cancelled.set()

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


@dataclass
class Counters:
    """llama-server's /metrics counters (since start) and the gauges' inputs."""

    requests_total: int = 0
    prompt_tokens_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    n_decode_total: int = 0
    n_tokens_max: int = 0


@dataclass
class _Pending:
    """Tokens whose text the stop scanner has not released yet, with their text offsets."""

    items: list[tuple[int, int, TokenInfo]] = field(default_factory=list)  # (start, end, token)

    def take(self, upto: int, cut: int | None = None) -> list[TokenInfo]:
        """Tokens whose text ends by `upto` (a stop string at `cut` keeps tokens that start before it)."""
        out = [t for s, e, t in self.items if e <= upto or (cut is not None and s < cut)]
        self.items = [] if cut is not None else [(s, e, t) for s, e, t in self.items if e > upto]
        return out

    def take_all(self) -> list[TokenInfo]:
        out, self.items = [t for _, _, t in self.items], []
        return out


class _Recording:
    """A Picker that picks through `picker` and keeps, for every token it accepts, the TokenInfo of the
    logits row it was chosen from (log-probabilities of the raw logits, before any sampler).

    The decoder calls choose once per generated token, then accept with that token (pick() and
    speculative.accept_draft: a guessed row's logits are only chosen from on the walk, and every
    choice is kept), so the entries line up with the tokens it yields, in order."""

    def __init__(self, picker: Sampler | ConstrainedSampler, info):
        self.picker = picker
        self._info = info  # (token, f32 [n_vocab] logits) -> TokenInfo
        self._chosen: TokenInfo | None = None
        self._accepted: deque[TokenInfo] = deque()

    @property
    def must_stop(self) -> bool:
        return bool(getattr(self.picker, "must_stop", False))

    def next_uniform(self) -> float:
        return self.picker.next_uniform()

    def choose(self, logits: np.ndarray, u: float) -> int:
        token = self.picker.choose(logits, u)
        self._chosen = self._info(token, logits)
        return token

    def accept(self, token: int) -> None:
        self.picker.accept(token)
        assert self._chosen is not None and self._chosen.id == token, "accept() without its choose()"
        self._accepted.append(self._chosen)
        self._chosen = None

    def take(self, token: int) -> TokenInfo:
        """The entry of the next yielded token."""
        info = self._accepted.popleft()
        assert info.id == token, f"recorded token {info.id}, the decoder yielded {token}"
        return info


class EngineWorker:
    """The thread that owns the model's engine. submit() from the event loop; everything else here
    runs on the thread."""

    def __init__(self, model, max_queued: int = 32):
        self.model = model
        self.max_queued = max_queued
        self.counters = Counters()
        self.lock = threading.Lock()  # guards counters, current and last
        self.current: Job | None = None
        self.last: Job | None = None
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._pieces: list[bytes] | None = None
        self.grammars = GrammarCache(model)  # the vocabulary is built on the first constrained request

    # -- event loop side ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kinetic-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            with self.lock:
                if self.current is not None:
                    self.current.cancelled.set()
            self._jobs.put(None)
            self._thread.join(timeout=5)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def deferred(self) -> int:
        return self._jobs.qsize()

    def submit(self, request: GenerationRequest) -> Job:
        if self._jobs.qsize() >= self.max_queued:
            raise ApiError(503, f"the server is busy: {self._jobs.qsize()} requests are already waiting; "
                                "try again shortly")
        job = Job(request, asyncio.get_running_loop())
        self._jobs.put(job)
        return job

    # -- engine thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if job.cancelled.is_set():
                continue
            with self.lock:
                self.current = job
                self.counters.requests_total += 1
            try:
                job.post(self._generate(job))
            except KineticError as e:
                job.post(Failed(400, e.message))
            except ApiError as e:
                job.post(Failed(e.status, e.message))
            except Exception as e:  # a bug: logged with its traceback, the client gets a clean 500
                log.error("internal error in the engine:\n%s", "".join(traceback.format_exception(e)))
                job.post(Failed(500, f"internal error: {type(e).__name__}"))
            finally:
                with self.lock:
                    self.current, self.last = None, job

    def _sampler(self, request: GenerationRequest) -> Sampler | ConstrainedSampler:
        s = request.settings
        pieces = None
        if s.dry_multiplier != 0 and s.dry_penalty_last_n != 0:
            if self._pieces is None:
                self._pieces = [self._piece(t) for t in range(self.model.engine.n_vocab)]
            pieces = self._pieces
        try:
            sampler = Sampler(s, pieces, n_vocab=self.model.engine.n_vocab, history=list(request.prompt))
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        return sampler if request.grammar is None else ConstrainedSampler(sampler, request.grammar.start())

    def _generate(self, job: Job) -> Finished:
        request, engine, tokenizer = job.request, self.model.engine, self.model.tokenizer
        sampler = self._sampler(request)
        ids = list(request.prompt)
        room = engine.n_ctx - len(ids)
        limit = room if request.max_tokens is None else min(request.max_tokens, room)
        eot = set() if request.ignore_eos else set(tokenizer.eot_ids)
        decoder = tokenizer.stream_decoder(skip_special=not request.keep_special)
        scanner = HoldBack(request.stop)
        pending = _Pending()
        fed = released = 0
        tokens: list[int] = []
        stop_type, word = "limit", ""
        t0, passes = time.perf_counter(), engine.passes
        steps = self._tokens(job, ids, limit, sampler)
        prompt_seconds = 0.0
        for token, info in steps:
            if not tokens:
                prompt_seconds = time.perf_counter() - t0
                t0 = time.perf_counter()
            tokens.append(token)
            job.n_decoded = len(tokens)
            if token in eot:
                stop_type = "eos"
                break
            text = decoder.push(token)
            pending.items.append((fed, fed + len(text), info))
            fed += len(text)
            out, marker = scanner.feed(text)
            if marker is not None:
                job.post(Piece(out, pending.take(released + len(out), cut=released + len(out))))
                stop_type, word = "word", marker
                break
            released += len(out)
            job.post(Piece(out, pending.take(released)))
        else:  # the decoder ended: the limit, or a grammar that allows nothing more. Not checked per
            # token: a drafted pass accepts several tokens into the sampler before they are yielded
            if request.grammar is not None and sampler.must_stop:
                stop_type = "eos"
        steps.close()
        if stop_type != "word":
            tail = scanner.feed(decoder.flush())[0] + scanner.flush()
            job.post(Piece(tail, pending.take_all()))
        generate_seconds = time.perf_counter() - t0 if tokens else 0.0
        self._count(len(ids), prompt_seconds, len(tokens), generate_seconds, engine.passes - passes)
        return Finished("length" if stop_type == "limit" else "stop", stop_type, word, len(ids), len(tokens), tokens,
                        prompt_seconds, generate_seconds, sampler.settings)

    def _tokens(self, job: Job, ids: list[int], limit: int,
                sampler: Sampler | ConstrainedSampler) -> Iterator[tuple[int, TokenInfo]]:
        """The model's tokens, as Model.generate picks them: the prompt in the engine's chunks, then
        RAD-1's decoder (model.decoder(); drafting as the model's `draft`, off with --off rad1), which
        yields plain decoding's tokens. Yields (token, its TokenInfo); stops early when cancelled."""
        engine, request = self.model.engine, job.request
        seq = engine.new_sequence()
        last = (len(ids) - 1) // engine.batch * engine.batch  # the last chunk goes with the decoder's prefill
        for start in range(0, last, engine.batch):  # engine.prefill's own chunks, so logits are identical
            if job.cancelled.is_set():
                return
            engine.feed(seq, ids[start:start + engine.batch])
            job.n_prompt_processed = start + engine.batch
        if job.cancelled.is_set():
            return
        decoder = self.model.decoder()
        with decoder.seen.lock:  # the decoder indexes the tokens it saw fed; the earlier chunks go first
            decoder.seen.extend(ids[:last])
        picker = _Recording(sampler, lambda token, logits: self._info(token, logits, request))
        eot = set() if request.ignore_eos else set(self.model.tokenizer.eot_ids)
        tokens = decoder.generate(seq, ids[last:], limit, stop=eot, picker=picker, draft=self.model.draft)
        try:
            for token in tokens:
                job.n_prompt_processed = len(ids)
                yield token, picker.take(token)
                if job.cancelled.is_set():
                    return
        finally:
            tokens.close()

    def _info(self, token: int, logits: np.ndarray, request: GenerationRequest) -> TokenInfo:
        if not request.logprobs:
            return TokenInfo(token, self._piece(token))
        logprob = float(log_softmax(logits)[token])
        top = tuple((t, self._piece(t), lp) for t, lp in top_logprobs(logits, request.top_logprobs))
        return TokenInfo(token, self._piece(token), logprob, top)

    def _piece(self, token: int) -> bytes:
        """A token's bytes; an output layer padded past the vocabulary has no text for the extra ids."""
        tokenizer = self.model.tokenizer
        return tokenizer.piece(token) if token < tokenizer.vocab_size else b""

    def _count(self, prompt: int, prompt_seconds: float, generated: int, generate_seconds: float,
               passes: int) -> None:
        with self.lock:
            c = self.counters
            c.prompt_tokens_total += prompt
            c.prompt_seconds_total += prompt_seconds
            c.tokens_predicted_total += generated
            c.tokens_predicted_seconds_total += generate_seconds
            c.n_decode_total += passes  # engine passes: prompt chunks, decode steps, drafted verifications
            c.n_tokens_max = max(c.n_tokens_max, prompt + generated)
