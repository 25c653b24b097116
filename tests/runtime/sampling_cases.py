"""What the sampling tests share: a chain with every filter off, token ids and log-probabilities."""

from __future__ import annotations

import numpy as np

# Every filter off, temperature 1: the chain returns the logits as the earlier stages leave them.
PLAIN = dict(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0)


def ids_of(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64)


def log(*probs: float) -> np.ndarray:
    return np.log(np.array(probs, dtype=np.float64))
