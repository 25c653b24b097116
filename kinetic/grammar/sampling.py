"""The grammar's hook into sampling: disallowed tokens get -inf before the sampler chain runs.

Owns: `apply_mask(logits, state)`. As llama.cpp applies the grammar first, the runtime calls it on a
row's logits before any sampler (penalties, top-k, temperature, ...), so the chain only ever sees
allowed tokens and the seeded draw is the one plain decoding makes.
Does not own: the sampler chain (kinetic.runtime.sampling), the grammar state (matcher.py).

Drafted rows: the verifier calls the same function on every drafted row with the state after that
row's ancestors (the prompt's state advanced by the drafted tokens on the row's path, e.g. from
`GrammarState.walk(draft)` or snapshot / accept / restore), so a constrained answer is the same with
or without drafting. A drafted token the grammar rejects gets -inf like any other, and the row's
descendants are not checked further.
"""

from __future__ import annotations

import numpy as np

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
