"""What the speculative decoding tests share: a seeded inverse-CDF sampler and one-hot logits."""

from __future__ import annotations

import numpy as np


class InverseCdfPicker:
    """A seeded sampler for the tests: softmax at a temperature, one uniform number per token,
    inverted through the CDF (what kinetic.Model does with a temperature)."""

    def __init__(self, temperature: float, seed: int):
        self.temperature = temperature
        self.rng = np.random.default_rng(seed)
        self.history: list[int] = []

    def next_uniform(self) -> float:
        return float(self.rng.random())

    def choose(self, logits: np.ndarray, u: float) -> int:
        z = logits.astype(np.float64) / self.temperature
        p = np.exp(z - z.max())
        cdf = np.cumsum(p / p.sum())
        return int(min(np.searchsorted(cdf, u, side="right"), len(cdf) - 1))

    def accept(self, token: int) -> None:
        self.history.append(token)


def one_hot(*tops: int, n_vocab: int = 8) -> np.ndarray:
    """Logits f32 [len(tops), n_vocab] whose row i has its one top token at tops[i]."""
    logits = np.zeros((len(tops), n_vocab), np.float32)
    logits[np.arange(len(tops)), tops] = 1.0
    return logits
