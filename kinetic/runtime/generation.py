"""Generation: one answer from a prompt's token ids, as events, the one loop every caller uses.

Owns: the answer loop that `Model.generate`, `kinetic run` and the server's scheduler all run:
prefill in the engine's chunks (a cancellation checked between chunks and after every token), the
sampler chain built from the settings (DRY's token texts included) and held to a grammar when one is
given, RAD-1's decoder (which yields plain decoding's tokens), end-of-turn tokens, stop strings
(never sent: kinetic/runtime/stop_strings.py), log-probabilities of the raw logits, and the answer's
statistics. Events: `Piece` (text that can go out now, with the tokens it came from), then one
`Finished`.
Does not own: tokenizing the prompt or applying a chat template (the caller hands token ids), what a
request field means in an API (the server validates requests), the queue of requests (scheduler.py)
or the forward passes themselves (engine.py, speculative.py).

Exactness: the prompt goes through the decoder's steps in `Engine.prefill`'s own chunks, so the
logits are the same whether or not a caller watches for cancellation between chunks; whether each
pass runs alone (iterating a Generation) or beside other answers' rows (steps() under the
scheduler's Convoy), batch invariance gives every row the same bits, so the answer is the same.
A caller's `sequence` (a conversation's cache: `kinetic chat`, a server slot's, the Python API's) is
continued rather than refilled; with Warm Start (kinetic/runtime/warm.py) it is first cut back to
what it shares with the prompt and extended from a stored state at a grid point when one reaches
further. Batch invariance makes those entries the ones a fresh prefill computes, and the rest of the
prompt runs in the grid chunks a cold run gives it, so the answer is the same.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from kinetic.errors import KineticError
from kinetic.runtime.engine import SeqRows
from kinetic.runtime.sampling import Sampler, SamplingSettings, log_softmax, top_logprobs
from kinetic.runtime.speculative import DraftStats, SpeculativeDecoder, run_alone
from kinetic.runtime.stop_strings import HoldBack
from kinetic.runtime.warm import grid_floor

if TYPE_CHECKING:
    from kinetic.grammar import ConstrainedSampler, GrammarMatcher
    from kinetic.runtime.engine import Engine, Sequence
    from kinetic.runtime.warm import WarmStore


@dataclass(frozen=True)
class GenerationRequest:
    """What one answer needs; built and validated by the caller (Model.generate, the server's APIs)."""

    prompt: tuple[int, ...]
    settings: SamplingSettings
    max_tokens: int | None = None  # None: until the answer ends or the context is full
    stop: tuple[str, ...] = ()  # stop strings, matched on the text; never sent
    logprobs: bool = False  # record each token's log-probability
    top_logprobs: int = 0  # and this many alternatives (0..20)
    ignore_eos: bool = False
    keep_special: bool = False  # keep control tokens' text (tool-call markers such as [TOOL_CALLS])
    grammar: GrammarMatcher | None = None  # hold the answer to this grammar
    draft: bool | None = None  # RAD-1 on or off for this answer; None: the Generator's default
    prefill_only: bool = False  # Zero Wait: run the prompt's whole grid chunks, keep the state, answer nothing


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
    tokens: list[int]  # every generated token, an end-of-turn token included
    prompt_seconds: float
    generate_seconds: float
    settings: SamplingSettings  # with the seed actually drawn
    passes: int = 0  # engine passes this answer ran (prompt chunks, decode steps, verifications)
    drafted: int = 0  # RAD-1's guessed rows and the guesses it kept
    accepted: int = 0
    cached_tokens: int = 0  # prompt tokens not computed: reused from a sequence or restored (Warm Start)
    held_tokens: int = 0  # prompt tokens in the sequence when the prompt part ended (a prefill's result)
    draft_sources: dict[str, tuple[int, int]] = field(default_factory=dict)  # drafter -> (guessed, kept)


class Generator:
    """Generation for one engine and tokenizer: the RAD-1 decoder (one per engine: it learns pass
    costs and indexes every request) and the token texts, built once."""

    def __init__(self, engine: Engine, tokenizer, draft: bool = True, warm: WarmStore | None = None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.draft = draft  # RAD-1 (docs/rad1.md): exact, so it changes only speed; False is --off rad1
        self.warm = warm  # Warm Start's states (kinetic/runtime/warm.py); None: --off warm-start
        self._decoder: SpeculativeDecoder | None = None
        self._pieces: list[bytes] | None = None

    @property
    def decoder(self) -> SpeculativeDecoder:
        if self._decoder is None:
            self._decoder = SpeculativeDecoder(self.engine)
        return self._decoder

    def piece(self, token: int) -> bytes:
        """A token's bytes; an output layer padded past the vocabulary has no text for the extra ids."""
        return self.tokenizer.piece(token) if token < self.tokenizer.vocab_size else b""

    def pieces(self) -> list[bytes]:
        """Every token's text (for DRY's sequence breakers), built once."""
        if self._pieces is None:
            self._pieces = [self.piece(t) for t in range(self.engine.n_vocab)]
        return self._pieces

    def sampler(self, settings: SamplingSettings, history: list[int],
                grammar: GrammarMatcher | None = None) -> Sampler | ConstrainedSampler:
        """The sampler chain for one answer; the prompt is its history (penalties and DRY see it, as
        in llama.cpp); held to `grammar` when given."""
        needs_pieces = settings.dry_multiplier != 0 and settings.dry_penalty_last_n != 0
        try:
            sampler = Sampler(settings, self.pieces() if needs_pieces else None, n_vocab=self.engine.n_vocab,
                              history=history)
        except ValueError as e:
            raise KineticError(f"bad sampling settings: {e}", "See docs/sampling.md.") from None
        if grammar is None:
            return sampler
        from kinetic.grammar import ConstrainedSampler  # numba: on use

        return ConstrainedSampler(sampler, grammar.start())

    def generate(self, request: GenerationRequest, cancelled: threading.Event | None = None,
                 sequence: Sequence | None = None) -> Generation:
        """`sequence`: continue this sequence (None: a new one). With Warm Start it is cut back to
        what it shares with the prompt and may be extended from a stored state; without, its tokens
        must be a prefix of the prompt."""
        return Generation(self, request, cancelled, sequence)

    def resume(self, seq: Sequence, ids: list[int]) -> int:
        """Prepare `seq` for the prompt `ids`; returns the prompt tokens it then holds (not recomputed)."""
        if self.warm is not None:
            return self.warm.resume(self.engine, seq, ids)
        done = len(seq.tokens)
        if done >= len(ids) or seq.tokens != ids[:done]:
            raise ValueError("the sequence must hold a prefix of the prompt, at least one token shorter")
        return done


class Generation:
    """One answer being generated. Iterate it for Piece events and one Finished at the end; once
    `cancelled` is set it stops within one pass (its Finished then says "length"). Its counters
    (prompt rows processed, tokens decoded) can be read from another thread while it runs.
    steps() is the same answer as steps, for a driver that shares passes between answers (Convoy:
    kinetic/runtime/scheduler.py); iterating is the one-answer driver of those steps."""

    def __init__(self, generator: Generator, request: GenerationRequest, cancelled: threading.Event | None = None,
                 sequence: Sequence | None = None):
        self.generator = generator
        self.request = request
        self.sequence = sequence
        self.cancelled = cancelled or threading.Event()
        self.sampler = generator.sampler(request.settings, list(request.prompt), request.grammar)
        self.n_prompt_processed = 0
        self.n_cached = 0  # prompt tokens not computed (held by the sequence or restored: Warm Start)
        self.n_held = 0  # prompt tokens in the sequence when the prompt part ended
        self.tokens: list[int] = []
        self.prompt_seconds = 0.0
        self.generate_seconds = 0.0
        self.drafted = self.accepted = 0
        self.finish_reason = "length"  # "stop" once an end of turn, a stop string or the grammar's end came
        self.passes = 0  # passes that held this answer's rows
        self.stats = DraftStats()  # RAD-1's for this answer

    @property
    def n_decoded(self) -> int:
        return len(self.tokens)

    def __iter__(self) -> Iterator[Piece | Finished]:
        """The answer on its own: each pass it wants runs by itself."""
        return run_alone(self.generator.engine, self.steps())

    def steps(self) -> Iterator[SeqRows | Piece | Finished]:
        """The answer as steps: before each pass, the rows it wants in it (a SeqRows: run it with
        Engine.run, alone or beside other answers' rows, then resume), between passes its Piece
        events, last one Finished. Once cancelled it wants no further pass."""
        request, tokenizer = self.request, self.generator.tokenizer
        eot = set() if request.ignore_eos else set(tokenizer.eot_ids)
        text = tokenizer.stream_decoder(skip_special=not request.keep_special)
        scanner, pending = HoldBack(request.stop), _Pending()
        fed = released = 0
        stop_type, word = "limit", ""
        start = time.perf_counter()
        steps = self._tokens(eot)
        try:
            for item in steps:
                if isinstance(item, SeqRows):
                    yield item
                    continue
                token, info = item
                if not self.tokens:  # the first token came with the prompt's last pass
                    self.prompt_seconds, start = time.perf_counter() - start, time.perf_counter()
                self.tokens.append(token)
                if token in eot:
                    stop_type = "eos"
                    break
                piece = text.push(token)
                pending.items.append((fed, fed + len(piece), info))
                fed += len(piece)
                out, marker = scanner.feed(piece)
                if marker is not None:
                    yield Piece(out, pending.take(released + len(out), cut=released + len(out)))
                    stop_type, word = "word", marker
                    break
                released += len(out)
                yield Piece(out, pending.take(released))
            else:  # the decoder ended: the limit, or a grammar that allows nothing more. Not checked per
                # token: a drafted pass accepts several tokens into the sampler before they are yielded
                if getattr(self.sampler, "must_stop", False):
                    stop_type = "eos"
        finally:
            steps.close()
            self.finish_reason = "length" if stop_type == "limit" else "stop"
            self.generate_seconds = time.perf_counter() - start if self.tokens else 0.0
            self.drafted, self.accepted = self.stats.drafted, self.stats.accepted
        if stop_type != "word":
            tail = scanner.feed(text.flush())[0] + scanner.flush()
            yield Piece(tail, pending.take_all())
        yield Finished(self.finish_reason, stop_type, word, len(request.prompt),
                       len(self.tokens), list(self.tokens), self.prompt_seconds, self.generate_seconds,
                       self.sampler.settings, self.passes, self.drafted, self.accepted, self.n_cached, self.n_held,
                       draft_sources=self.stats.sources())

    def _tokens(self, eot: set[int]) -> Iterator[SeqRows | tuple[int, TokenInfo]]:
        """The model's tokens as plain decoding picks them: RAD-1's decoder's steps (drafting as the
        request or the generator says: the prompt in Engine.prefill's chunks, then plain decoding's
        tokens). Yields the rows each pass wants and (token, its TokenInfo); stops when cancelled."""
        generator, engine, request = self.generator, self.generator.engine, self.request
        ids = list(request.prompt)
        if self.sequence is None:
            self.sequence = engine.new_sequence()
        seq = self.sequence
        began = time.perf_counter()
        done = self.n_cached = self.n_prompt_processed = generator.resume(seq, ids)
        picker = _Recording(self.sampler, self._info)
        draft = generator.draft if request.draft is None else request.draft
        if request.prefill_only:  # whole grid chunks only: the request that follows runs the same ones
            steps = engine.prompt_steps(seq, ids[done:grid_floor(len(ids), engine.batch)], logits=False)
        else:
            steps = generator.decoder.steps(seq, ids[done:], request.max_tokens, stop=eot, picker=picker,
                                            draft=draft, stats=self.stats, top=0 if request.logprobs else None)
        try:
            for item in steps:
                if self.cancelled.is_set():
                    return
                if isinstance(item, SeqRows):
                    yield item
                    if self.cancelled.is_set():  # a driver may drop a cancelled answer's rows unrun
                        return
                    self.passes += 1
                    self.n_prompt_processed = min(len(seq.tokens), len(ids))
                    continue
                if not self.tokens:  # the prompt's part has ended: its speed teaches Warm Start
                    self._prompt_done(seq, ids, time.perf_counter() - began)
                self.n_prompt_processed = len(ids)
                yield item, picker.take(item)
        finally:
            steps.close()
            if not self.tokens:
                self._prompt_done(seq, ids, time.perf_counter() - began)
            if generator.warm is not None:
                generator.warm.keep(engine, seq)

    def _prompt_done(self, seq: Sequence, ids: list[int], seconds: float) -> None:
        self.n_held = min(len(seq.tokens), len(ids))
        if self.generator.warm is not None:
            self.generator.warm.costs.observe_prefill(self.n_held - self.n_cached, seconds)

    def _info(self, token: int, logits: np.ndarray) -> TokenInfo:
        piece = self.generator.piece
        if not self.request.logprobs:
            return TokenInfo(token, piece(token))
        logprob = float(log_softmax(logits)[token])
        top = tuple((t, piece(t), lp) for t, lp in top_logprobs(logits, self.request.top_logprobs))
        return TokenInfo(token, piece(token), logprob, top)


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
