"""RAD-1's drafters and drafting policy: where guessed tokens come from and how many to verify.

Owns: the drafters (the request's own context; an index of every token this process has seen,
shared per engine; a model's own prediction block, kinetic/runtime/mtp.py, joins them in
drafters_for()), the draft tree built from a proposal, and the policy: which drafter proposes (the
one lately right most), how long the draft is (recent acceptance against the measured cost of
verifying rows) and the backoff after outright misses; `ForcedDraft`, the policy that measures one
drafter by drafting its whole chain every step.
Does not own verification or the exactness argument (kinetic/runtime/speculative.py): a draft is
only a guess, so nothing here can change an answer, only its speed. Nor the n-gram index the first
two look up (kinetic/runtime/ngram_index.py; NgramIndex and CONTEXT_ORDERS are importable from here).
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kinetic.ir.rows import PassRows
from kinetic.runtime.ngram_index import CONTEXT_ORDERS, NgramIndex

SEEN_ORDERS = (4, 2)
SEEN_BUDGET = 1 << 20  # tokens the shared index keeps: 20 MiB in all (tokens 4, chains 8, heads 8)
SEEN_SLOT_BITS = 19


@dataclass(frozen=True)
class Proposal:
    source: str  # drafter and order, e.g. "context/4": acceptance is tracked per source
    branches: list[list[int]]  # continuations of the context, best first, distinct first tokens


class Drafter(Protocol):
    """A source of guesses. `context` is every token of the sequence so far, the newest last (it
    only grows during a request); the proposal continues it."""

    name: str

    def propose(self, context: list[int], max_len: int) -> Proposal | None: ...


class ContextDrafter:
    """Prompt lookup: what followed the latest earlier occurrences of the context's last n tokens."""

    name = "context"

    def __init__(self, capacity: int, orders=CONTEXT_ORDERS):
        self.index = NgramIndex(capacity, orders)

    def propose(self, context: list[int], max_len: int) -> Proposal | None:
        if self.index.total < len(context):
            self.index.extend(context[self.index.total:])
        n, branches = self.index.continuations(context, max_len)
        return Proposal(f"{self.name}/{n}", branches) if branches else None


class SeenDrafter:
    """Earlier requests: the same lookup in the engine's index of every token it has seen (the
    decoder adds each request's tokens when it ends, so a request never drafts from itself here)."""

    name = "seen"

    def __init__(self, index: NgramIndex):
        self.index = index

    def propose(self, context: list[int], max_len: int) -> Proposal | None:
        with self.index.lock:
            n, branches = self.index.continuations(context, max_len)
        return Proposal(f"{self.name}/{n}", branches) if branches else None


_seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def seen_index(engine) -> NgramIndex:
    """The index of every token an engine has seen, one per engine (allocated on first use)."""
    if engine not in _seen:
        _seen[engine] = NgramIndex(SEEN_BUDGET, SEEN_ORDERS, SEEN_SLOT_BITS)
    return _seen[engine]


def drafters_for(engine, seen: NgramIndex, seq=None) -> list[Drafter]:
    """The drafters of one request, side by side: the context, earlier requests and, for a sequence
    of a model with a prediction block (qwen35's MTP layer), the block (source "mtp"; it drafts from
    the last kept row's hidden state and token: kinetic/runtime/mtp.py). The policy ranks them all
    by their acceptance."""
    from kinetic.runtime.mtp import mtp_drafter  # mtp.py imports this module (Proposal)

    drafters: list[Drafter] = [ContextDrafter(engine.n_ctx + 1), SeenDrafter(seen)]
    block = mtp_drafter(engine, seq) if seq is not None else None
    return drafters + [block] if block is not None else drafters


@dataclass(frozen=True)
class DraftTree:
    """A pass's rows: row 0 is the last generated token (not yet in the cache), every other row a
    guessed token; parents[i] < i, parents[0] = -1."""

    tokens: list[int]
    parents: list[int]

    def children(self) -> list[dict[int, int]]:
        """Per row, its children by token (siblings never repeat a token)."""
        kids: list[dict[int, int]] = [{} for _ in self.tokens]
        for row in range(1, len(self.tokens)):
            kids[self.parents[row]][self.tokens[row]] = row
        return kids

    def rows(self, start: int) -> PassRows:
        """The pass of this tree after a cache of `start` entries: a row's position is its depth."""
        depth = [0] * len(self.tokens)
        for row in range(1, len(self.tokens)):
            depth[row] = depth[self.parents[row]] + 1
        n = len(self.tokens)
        return PassRows(tokens=np.array(self.tokens, np.int32),
                        positions=(start + np.array(depth)).astype(np.int32),
                        seqs=np.zeros(n, np.int32), parents=np.array(self.parents, np.int32),
                        output_rows=np.arange(n, dtype=np.int32))


def build_tree(root: int, branches: list[list[int]], rows: int, spare: int = 0) -> DraftTree:
    """The main branch's first `rows` guesses, then up to `spare` rows of the alternatives (other
    continuations, each a child of the root), in order."""
    tokens, parents = [root], [-1]
    for i, branch in enumerate(branches):
        take = min(len(branch), rows if i == 0 else spare)
        spare -= take if i else 0
        parent = 0
        for token in branch[:take]:
            tokens.append(token)
            parents.append(parent)
            parent = len(tokens) - 1
    return DraftTree(tokens, parents)


class DraftPolicy:
    """Which proposal to verify and how many rows, from recent acceptance and measured costs.

    Acceptance: per source, decayed counts of guessed tokens that matched what was generated and of
    tokens compared; every proposal is scored against the generated tokens, drafted or not, so a
    source that went quiet can win back its turn. Cost: verifying k guessed rows costs (1 + beta k)
    plain decode steps, beta measured from this decoder's own passes. With acceptance a, a chain of
    k guesses yields 1 + a + ... + a^k tokens on average (each guess needs the ones before it), so
    the speed-up is (1 + a + ... + a^k) / (1 + beta k); the policy drafts the best k only when that
    beats 1 by MARGIN. After a drafted pass that keeps no guess, drafting pauses for 2, 4, 8, ...
    steps (at most MAX_PAUSE), so undraftable text costs one lookup now and then.

    Branches: an alternative at the root adds q tokens (the chance that the main guess is wrong and
    it is right) for beta more cost; that pays only when q / beta beats the pass's speed-up, so
    with beta ~0.45 (a 2-core CPU) almost never, with beta ~0.05 (a GPU) often. Alternatives get a
    half as many rows as the main branch (at least 2), on top of them, where beta <= BRANCH_BETA.

    Costly drafters (`costly = True`: a model's prediction block runs a pass of its own per guess)
    are asked only for the chain the gate would verify at their acceptance, and while that is none,
    for one guess every PROBE_EVERY-th step (its first guess comes with the block's catch-up pass,
    which it runs anyway), so a block that starts guessing right is noticed (`ask_len`).
    """

    DECAY = 0.75
    PRIOR = (1.0, 2.0)  # (matched, compared) of a source never seen: a = 0.5
    MARGIN = 1.05
    MAX_PAUSE = 256
    BRANCH_BETA = 0.15  # alternatives only where rows are this cheap (a GPU), not on a small CPU
    PROBE_EVERY = 16  # steps between probes of a costly drafter the gate would not draft from

    def __init__(self, costs: PassCosts, max_rows: int = 16):
        self.costs = costs
        self.max_rows = max_rows
        self.score: dict[str, list[float]] = {}
        self.misses = 0
        self.pause = 0
        self.unasked: dict[str, int] = {}  # costly drafter -> steps since it was last asked

    def ready(self) -> bool:
        """Whether to look for drafts this step (False while backing off)."""
        if self.pause:
            self.pause -= 1
            return False
        return True

    def acceptance(self, source: str) -> float:
        matched, compared = self.score.get(source, self.PRIOR)
        return matched / compared

    def choose(self, proposals: list[Proposal], room: int) -> tuple[Proposal, int, int] | None:
        """The proposal of the source with the best acceptance, its main branch's rows and the rows
        for alternatives; None: decode plainly."""
        if not proposals or room < 1:
            return None
        best = max(proposals, key=lambda p: self.acceptance(p.source))
        beta = self.costs.beta
        gain, k = self._gate(self.acceptance(best.source), min(room, self.max_rows, len(best.branches[0])))
        if gain <= self.MARGIN:
            return None
        spare = min(max(2, k // 2), room - k) if beta <= self.BRANCH_BETA else 0
        return best, k, spare

    def _gate(self, a: float, most: int) -> tuple[float, int]:
        """(the best modelled speed-up, its rows) of a chain of at most `most` guesses at acceptance a.

        Alone, k guesses give e(k) = 1 + a + ... + a^k tokens for a pass of 1 + beta k: e(k) / (1 + beta k).
        Beside N - 1 other answers (Convoy; N = costs.company), the unit is the shared pass: its N
        rows cost 1 + beta (N - 1) one-row passes, so k more rows make it 1 + beta_N k times as long
        for every answer in it, beta_N = beta / (1 + beta (N - 1)), while its tokens go from N to
        N - 1 + e(k): the pass's speed-up is (N - 1 + e(k)) / N / (1 + beta_N k), which is the
        formula alone at N = 1. A guess that pays alone can cost the others more than it gives
        (beta 0.45, a = 0.8: 2 rows alone, 1 at N = 2, none at N = 4)."""
        n = self.costs.company
        beta = self.costs.beta
        beta_n = beta / (1 + beta * (n - 1))
        gain, k, expected, ak = 0.0, 0, 1.0, 1.0
        for rows in range(1, most + 1):
            ak *= a
            expected += ak
            speedup = (n - 1 + expected) / n / (1 + beta_n * rows)
            if speedup > gain:
                gain, k = speedup, rows
        return gain, k

    def ask_len(self, drafter: Drafter, room: int) -> int:
        """How many guesses to ask `drafter` for this step (0: do not ask): `room` for a cheap one; for
        a costly one, the rows the gate would draft at its acceptance, else 1 every PROBE_EVERY-th step."""
        if not getattr(drafter, "costly", False) or room < 1:
            return room
        gain, k = self._gate(self.acceptance(drafter.name), min(room, self.max_rows))
        if gain > self.MARGIN:
            self.unasked[drafter.name] = 0
            return k
        ago = self.unasked[drafter.name] = self.unasked.get(drafter.name, self.PROBE_EVERY - 1) + 1
        if ago < self.PROBE_EVERY:
            return 0
        self.unasked[drafter.name] = 0
        return 1

    def record(self, proposals: list[Proposal], generated: list[int], drafted: bool, accepted: int) -> None:
        """Score every proposal against the tokens this step generated; back off after a miss."""
        for p in proposals:
            guess = p.branches[0]
            m = 0
            while m < min(len(guess), len(generated)) and guess[m] == generated[m]:
                m += 1
            compared = m + 1 if m < len(guess) and m < len(generated) else m
            s = self.score.setdefault(p.source, list(self.PRIOR))
            s[0] = s[0] * self.DECAY + m
            s[1] = s[1] * self.DECAY + compared
        if drafted and accepted == 0:
            self.misses += 1
            self.pause = min(2 ** self.misses, self.MAX_PAUSE)
        elif accepted:
            self.misses = 0


class ForcedDraft(DraftPolicy):
    """A policy for measuring one drafter, never the default: the drafter `source`'s whole chain every
    step, whatever its acceptance (a drafter that is rarely right, such as an untrained prediction
    block, is otherwise gated off). benchmarks/mtp.py and tests/runtime/test_mtp.py run the model's
    prediction block ("mtp") this way; as any draft, it changes the speed, never the answer."""

    source = "mtp"

    def ready(self) -> bool:
        return True

    def ask_len(self, drafter: Drafter, room: int) -> int:
        return room

    def choose(self, proposals: list[Proposal], room: int) -> tuple[Proposal, int, int] | None:
        mine = [p for p in proposals if p.source == self.source]
        return (mine[0], min(room, len(mine[0].branches[0])), 0) if mine and room > 0 else None


class PassCosts:
    """What a pass of 1 + k rows costs relative to a plain decode step, as 1 + beta k. beta starts
    from PRIOR_BETA (SmolLM2, 2 threads of this project's CPU: docs/rad1.md), then is the median of
    the decoder's recent drafted passes, each against the plain steps just before it, so one odd pass
    does not swing it (a GPU's beta is near 0). The decoder gives each pass's CPU time, not the
    clock's (speculative.py), so another process's load does not make rows look dear. Samples expire
    after MAX_AGE seconds: a beta measured in a passing state would otherwise stop drafting for good,
    since only drafted passes can measure it again."""

    PRIOR_BETA = 0.45
    WINDOW = 15  # recent drafted passes
    MAX_AGE = 20.0  # seconds
    DECAY = 0.8  # of the plain step's running average

    def __init__(self, beta: float = PRIOR_BETA):
        self.prior = beta
        self.plain: float | None = None  # seconds of a plain decode step, averaged
        self.samples: deque[tuple[float, float]] = deque(maxlen=self.WINDOW)  # (when, beta of one pass)
        # answers decoding in the pass (the scheduler sets it before each pass; 1: alone). Only passes
        # alone are priced: a shared pass's time holds the other answers' rows and Python work.
        self.company = 1

    def observe(self, guessed_rows: int, seconds: float) -> None:
        if self.company > 1:
            return
        if guessed_rows == 0:
            self.plain = seconds if self.plain is None else self.DECAY * self.plain + (1 - self.DECAY) * seconds
        elif self.plain:
            self.samples.append((time.monotonic(), (seconds / self.plain - 1) / guessed_rows))

    @property
    def beta(self) -> float:
        while self.samples and self.samples[0][0] < time.monotonic() - self.MAX_AGE:
            self.samples.popleft()
        if len(self.samples) < 3:
            return self.prior
        return max(0.0, statistics.median(b for _, b in self.samples))
