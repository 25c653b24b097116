"""What the Shortlist and output-layer tests share: greedy decoding that keeps each chosen token's score."""

from __future__ import annotations

import numpy as np

from kinetic.runtime.engine import Engine


def greedy_with_scores(engine: Engine, prompt: list[int], steps: int, top: int) -> tuple[list[int], list[float]]:
    """`steps` greedy tokens after `prompt`, each pass asking for `top` best rows (0: every logit), and
    the logit of each chosen token."""
    seq = engine.new_sequence()
    logits = engine.prefill(seq, prompt, top=top)
    tokens, scores = [], []
    for _ in range(steps):
        token = int(np.argmax(logits))
        tokens.append(token)
        scores.append(float(logits[token]))
        logits = engine.decode(seq, token, top=top)
    return tokens, scores
