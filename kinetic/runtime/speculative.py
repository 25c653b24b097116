"""RAD-1 verification: drafted decoding that yields exactly the tokens plain decoding yields.

Owns: the Picker protocol (how a token is chosen from logits), the acceptance rule over a verified
draft tree, and the decoding loop that drafts, verifies in one pass and keeps the accepted rows'
cache entries (Engine.verify / Engine.keep). The loop is written as steps (`SpeculativeDecoder.steps`):
it yields the rows it wants in its next pass (an `engine.SeqRows`, whose logits the driver fills in
before resuming it) and the tokens it generates, so one sequence can run alone (`run_alone`,
`generate`) or share each pass with others (the scheduler's Convoy) through the same code. Does not
own where drafts come from or how many (kinetic/runtime/drafting.py), nor the sampler chain
(kinetic.runtime.sampling.Sampler is a Picker), nor text, nor which sequences share a pass.

Why the output cannot change: a tree row's logits are bit for bit what its path gives decoded
plainly (the engine's batch-invariance contract, tests/runtime/test_engine.py), and the acceptance
rule picks every token from those logits with the same picker, the same random number and the same
history as plain decoding would. A guess only decides which row's logits are available next.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Generator, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from kinetic.ir.rows import PassRows
from kinetic.runtime.drafting import (
    DraftPolicy,
    DraftTree,
    NgramIndex,
    PassCosts,
    Proposal,
    build_tree,
    drafters_for,
    seen_index,
)
from kinetic.runtime.engine import Engine, SeqRows, Sequence
from kinetic.runtime.shortlist import picker_rows_needed

Steps = Iterator["SeqRows | int"]  # a decoding loop's steps: rows it wants (logits filled in) and tokens


class Picker(Protocol):
    """Chooses tokens. Decoding one token is: u = next_uniform(); t = choose(logits, u); accept(t)."""

    def next_uniform(self) -> float:
        """The next random number in [0, 1) of the stream (exactly one per generated token)."""

    def choose(self, logits: np.ndarray, u: float) -> int:
        """The token for f32 [n_vocab] logits and u, given the history accepted so far (no state change)."""

    def accept(self, token: int) -> None:
        """Append token to the history (penalties, mirostat and grammar state advance)."""


class GreedyPicker:
    """Greedy decoding: the top token, the lowest id on ties (np.argmax, as plain decoding); u unused."""

    def next_uniform(self) -> float:
        return 0.0

    def choose(self, logits: np.ndarray, u: float) -> int:
        return int(np.argmax(logits))

    def accept(self, token: int) -> None:
        pass


def accept_draft(tree: DraftTree, logits: np.ndarray, picker: Picker, limit: int,
                 stop: Collection[int]) -> tuple[list[int], list[int]]:
    """Walk a verified tree as plain decoding would: (rows whose logits were used, root first, each
    the parent of the next; the tokens generated, at most `limit`, ending at a stop token).

    logits f32 [len(tree.tokens), n_vocab]: row r's logits are p(. | context, path to r).
    At row r, plain decoding's next token is t = choose(p_r, u) with the next u of the stream.
    If a child of r guessed t, its row holds p(. | ..., t): the walk moves there and the guess costs
    nothing. Otherwise t is still the right token, and the rest of the tree is dropped.
    Greedy: choose is argmax, so a guess is kept iff it is the model's top token.
    Sampling: choose inverts the CDF of p_r at u, so t ~ p_r. A guess x is kept with probability
    p_r(x) (min(1, p/q) of speculative sampling for a drafter that proposes x with certainty,
    q = one-hot x), and on rejection t ~ p_r without x, renormalized: the residual norm(max(0, p - q)).
    So each token has plain sampling's distribution; more than that, with the same u stream it is
    the same token, because u is drawn once per generated token, in order, never per guess.
    """
    children = tree.children()
    path, generated, row = [0], [], 0
    while True:
        token = picker.choose(logits[row], picker.next_uniform())
        picker.accept(token)
        generated.append(token)
        if token in stop or len(generated) >= limit or finished(picker):
            return path, generated
        row = children[row].get(token, -1)
        if row < 0:
            return path, generated
        path.append(row)


@dataclass
class DraftStats:
    drafted: int = 0  # guessed rows verified
    accepted: int = 0  # guesses kept
    passes: int = 0  # passes after the prompt (plain and drafted)
    drafted_passes: int = 0
    tree_passes: int = 0  # drafted passes with alternative branches
    branch_hits: int = 0  # passes whose kept path went through an alternative
    by_source: dict = field(default_factory=dict)  # drafter ("context", "seen", "mtp") -> [guessed, kept]

    def sources(self) -> dict[str, tuple[int, int]]:
        """A copy of by_source: drafter -> (guessed rows verified, guesses kept)."""
        return {name: (guessed, kept) for name, (guessed, kept) in self.by_source.items()}


def finished(picker: Picker) -> bool:
    """Whether the picker allows nothing after the tokens it accepted (a grammar that is complete and
    can only end): generation ends there, as at a stop token."""
    return bool(getattr(picker, "must_stop", False))


def pick(picker: Picker, logits: np.ndarray) -> int:
    """One plainly decoded token."""
    token = picker.choose(logits, picker.next_uniform())
    picker.accept(token)
    return token


def pass_clock(engine: Engine) -> Callable[[], float]:
    """The clock that prices an engine's passes. On the CPU every pass is the process's own work, so
    its CPU time: a pass another process held up says nothing about what rows cost (on this loaded
    2-vCPU machine the wall clock's ratios put beta anywhere from 0.16 to 1.6, and above ~1 drafting
    stopped). On a GPU the pass is mostly the device's time, which only the wall clock sees."""
    return time.process_time if engine.device == "cpu" else time.perf_counter


def generation_limit(engine: Engine, seq: Sequence, prompt: list[int], max_tokens: int | None) -> int:
    """Tokens to generate at most: max_tokens (None or negative: no limit), and the context's room.
    The last generated token is never fed back, so the cache never holds more than n_ctx entries."""
    room = engine.n_ctx - seq.cache.length - len(prompt)
    return room if max_tokens is None or max_tokens < 0 else min(max_tokens, room)


def run_alone(engine: Engine, steps: Iterator) -> Iterator:
    """Drives a steppable loop on its own: each pass it wants (a SeqRows) runs by itself; everything
    else it yields (tokens, or a generation's Piece and Finished events) is passed on."""
    try:
        for item in steps:
            if isinstance(item, SeqRows):
                engine.run([item])
            else:
                yield item
    finally:
        steps.close()


def plain_decode(engine: Engine, seq: Sequence, prompt: list[int], max_tokens: int | None,
                 stop: Collection[int] = frozenset(), picker: Picker | None = None) -> Iterator[int]:
    """Plain decoding, one pass per token: what drafted decoding must reproduce. Yields each token,
    the stop token included (then ends)."""
    picker = picker or GreedyPicker()
    limit = generation_limit(engine, seq, prompt, max_tokens)
    if limit <= 0:
        return
    logits = engine.prefill(seq, prompt)
    for n in range(1, limit + 1):
        token = pick(picker, logits)
        yield token
        if token in stop or n == limit or finished(picker):
            return
        logits = engine.decode(seq, token)


class SpeculativeDecoder:
    """Drafted decoding for one engine; keep one per engine (it learns the engine's pass costs and
    indexes every answer's tokens; several answers may run their steps at once on one thread).

    generate() yields exactly plain_decode()'s tokens, stop token included, and leaves the sequence's
    cache as plain decoding does (every generated token but the last). stats describes the last
    generate() call; steps() counts into the DraftStats it is given.
    """

    def __init__(self, engine: Engine, *, max_rows: int = 16, draft: bool = True, seen: NgramIndex | None = None,
                 costs: PassCosts | None = None):
        self.engine = engine
        self.seen = seen if seen is not None else seen_index(engine)  # earlier requests, shared per engine
        self.max_rows = max_rows
        self.draft = draft
        self.costs = costs or PassCosts()
        self.stats = DraftStats()

    def generate(self, seq: Sequence, prompt: list[int], max_tokens: int | None,
                 stop: Collection[int] = frozenset(), picker: Picker | None = None,
                 draft: bool | None = None) -> Iterator[int]:
        """`draft` (default: the decoder's) turns drafting on or off for this call only."""
        self.stats = DraftStats()
        return run_alone(self.engine, self.steps(seq, prompt, max_tokens, stop, picker, draft, self.stats))

    def steps(self, seq: Sequence, prompt: list[int], max_tokens: int | None,
              stop: Collection[int] = frozenset(), picker: Picker | None = None,
              draft: bool | None = None, stats: DraftStats | None = None, top: int | None = None) -> Steps:
        """generate()'s loop as steps: yields a SeqRows before each pass (prompt chunks, then one
        decode row or a draft tree per pass; resume it once its logits are filled in) and each token.
        `top`: Shortlist's rows per choice (SeqRows.top; 0 every logit; None: as the picker needs)."""
        engine, picker, stats = self.engine, picker or GreedyPicker(), stats if stats is not None else DraftStats()
        limit = generation_limit(engine, seq, prompt, max_tokens)
        if limit <= 0:
            return
        seen = self.seen
        start = len(seq.tokens)
        drafters = drafters_for(engine, seen, seq) if (self.draft if draft is None else draft) else []
        policy = DraftPolicy(self.costs, self.max_rows)
        # Shortlist: how many best logits the picker's choice depends on (0: all; kinetic/runtime/shortlist.py)
        top = picker_rows_needed(picker, logprobs=False, n_vocab=engine.n_vocab) if top is None else top
        token = pick(picker, (yield from engine.prompt_steps(seq, prompt, top=top)))
        context, generated = list(seq.tokens), 1
        try:
            while True:
                yield token
                if token in stop or generated >= limit or finished(picker):  # the state after token
                    return
                context.append(token)
                room = limit - generated - 1  # guessed rows that fit (the limit bounds the cache too)
                proposals = []
                if drafters and room > 0 and policy.ready():
                    proposals = [p for d in drafters
                                 if (n := policy.ask_len(d, min(room, self.max_rows))) and (p := d.propose(context, n))]
                out, guessed, kept = yield from self._pass(seq, token, policy.choose(proposals, room), picker,
                                                           limit - generated, stop, stats, top)
                policy.record(proposals, out, guessed > 0, kept)
                for t in out[:-1]:  # accepted guesses: never a stop token, never past the limit
                    yield t
                    context.append(t)
                token, generated = out[-1], generated + len(out)
        finally:
            with seen.lock:
                seen.extend(seq.tokens[start:] + [token])

    def _pass(self, seq: Sequence, token: int, choice: tuple[Proposal, int, int] | None, picker: Picker, left: int,
              stop: Collection[int], stats: DraftStats,
              top: int = 0) -> Generator[SeqRows, None, tuple[list[int], int, int]]:
        """One pass after `token`, as a step: plain (choice None) or a drafted tree. Returns the tokens
        it generates (at most `left`), the guessed rows and the guesses kept. The pass's cost, which
        teaches the costs, is the whole shared pass's when others share it, on `pass_clock`."""
        engine = self.engine
        clock = pass_clock(engine)
        began = clock()
        if choice is None:
            want = SeqRows(seq, PassRows.chain([token], seq.cache.length), top=top)
            yield want
            out, guessed, kept = [pick(picker, want.logits[-1])], 0, 0
        else:
            proposal, rows, spare = choice
            tree = build_tree(token, proposal.branches, rows, spare)
            want = SeqRows(seq, tree.rows(seq.cache.length), commit=False, top=top)
            yield want
            path, out = accept_draft(tree, want.logits, picker, left, stop)
            engine.keep(seq, path)
            guessed, kept = len(tree.tokens) - 1, len(path) - 1
            counts = stats.by_source.setdefault(proposal.source.split("/")[0], [0, 0])
            counts[0], counts[1] = counts[0] + guessed, counts[1] + kept
            stats.drafted_passes += 1
            stats.tree_passes += tree.parents.count(0) > 1
            stats.branch_hits += kept > 0 and path[1] != 1
        self.costs.observe(guessed, clock() - began)
        stats.passes += 1
        stats.drafted += guessed
        stats.accepted += kept
        return out, guessed, kept
