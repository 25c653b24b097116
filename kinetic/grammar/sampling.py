"""The grammar's hook into sampling: disallowed tokens get -inf before the sampler chain runs.

Owns: `apply_mask(logits, state)` and `ConstrainedSampler`, a Sampler held to a grammar. As
llama.cpp applies the grammar first, the mask goes on a row's logits before any sampler (penalties,
top-k, temperature, ...), so the chain only ever sees allowed tokens and the seeded draw is the one
plain decoding makes.
Does not own: the sampler chain (kinetic.runtime.sampling), the grammar state (matcher.py), when
generation stops (the caller asks `must_stop` after each token).

Drafted rows: the verifier calls the same function on every drafted row with the state after that
row's ancestors (the prompt's state advanced by the drafted tokens on the row's path, e.g. from
`GrammarState.walk(draft)` or snapshot / accept / restore), so a constrained answer is the same with
or without drafting. A drafted token the grammar rejects gets -inf like any other, and the row's
descendants are not checked further. ConstrainedSampler does this by itself when used as RAD-1's
picker: the verifier walks the tree with choose / accept, so its state is always the path's.
"""

from __future__ import annotations

import numpy as np

from kinetic.grammar.gbnf_ast import GrammarError
from kinetic.grammar.matcher import GrammarState


def apply_mask(logits: np.ndarray, state: GrammarState | None) -> np.ndarray:
    """Set the logits of tokens `state` does not allow to -inf, in place; returns `logits`.

    logits: float [n_logits] for one row (n_logits may exceed the vocabulary when the output layer
    is padded: the padding is disallowed). `state` None leaves the logits alone (no grammar)."""
    if state is None:
        return logits
    mask = state.mask()  # bool [n_vocab]
    n = mask.shape[0]
    if logits.shape[-1] < n:
        raise ValueError(f"logits have {logits.shape[-1]} entries, the grammar's vocabulary {n}")
    np.copyto(logits[..., :n], -np.inf, where=~mask)
    logits[..., n:] = -np.inf
    return logits


class ConstrainedSampler:
    """A Sampler (or any picker with next_uniform / choose / accept) held to a grammar.

        u = picker.next_uniform()          # the sampler's own stream: still one uniform per token
        token = picker.choose(logits, u)   # the sampler's choice over the masked logits; pure
        picker.accept(token)               # the grammar state, then the sampler, move past token
        picker.must_stop                   # the grammar allows nothing but end of generation now

    The row's logits are copied, never changed. With the same seed a constrained answer is the same
    every time, and the same with or without drafting."""

    def __init__(self, sampler, state: GrammarState):
        self.sampler = sampler
        self.state = state

    @property
    def settings(self):
        return self.sampler.settings

    def next_uniform(self) -> float:
        return self.sampler.next_uniform()

    def choose(self, logits: np.ndarray, u: float) -> int:
        return self.sampler.choose(self.masked(logits), u)

    def accept(self, token: int, logits: np.ndarray | None = None) -> None:
        """Advance past `token`: GrammarError if the grammar does not allow it (nothing moves then).
        `logits`, when given, go to the sampler masked (Mirostat's surprise is over allowed tokens)."""
        masked = None if logits is None else self.masked(logits)  # the mask before the state moves
        self.state.accept(token)
        if masked is None:
            self.sampler.accept(token)
        else:
            self.sampler.accept(token, masked)

    def sample(self, logits: np.ndarray) -> int:
        """Plain decoding of one token: exactly next_uniform, choose, accept."""
        token = self.choose(logits, self.next_uniform())
        self.accept(token)
        return token

    def masked(self, logits: np.ndarray) -> np.ndarray:
        """A copy of one row of logits with the tokens the grammar does not allow at -inf."""
        if not self.state.mask().any():
            raise GrammarError("the grammar allows no token of this model's vocabulary here",
                               "The grammar needs text this tokenizer cannot write; check its literals.")
        return apply_mask(np.array(logits, copy=True), self.state)

    @property
    def must_stop(self) -> bool:
        return self.state.must_stop

    @property
    def is_complete(self) -> bool:
        return self.state.is_complete

    def snapshot(self) -> tuple:
        return self.sampler.snapshot(), self.state.snapshot()

    def restore(self, snapshot: tuple) -> None:
        sampler_state, grammar_state = snapshot
        self.sampler.restore(sampler_state)
        self.state.restore(grammar_state)
