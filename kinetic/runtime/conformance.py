"""Comparing greedy tokens with a reference engine's (llama.cpp's golden data), up to near-ties.

A reference step is a near-tie when its two likeliest tokens are within NEAR_TIE nats: another
correct engine that rounds differently may pick the other one, after which the texts legitimately
differ. Agreement is counted up to the first divergence; a divergence at a near-tie is acceptable.
"""

from __future__ import annotations

from dataclasses import dataclass

NEAR_TIE = 0.1


@dataclass(frozen=True)
class Agreement:
    agreed: int  # tokens equal before the first divergence
    total: int  # reference tokens
    diverged_at: int | None  # step of the first divergence, None when all agree
    near_tie: bool  # the divergence happened at a near-tie (acceptable)
    gap: float | None  # the reference's top-2 log-probability gap at the divergence

    @property
    def ok(self) -> bool:
        return self.diverged_at is None or self.near_tie


def compare(ours: list[int], reference_ids: list[int], top2: list[list[dict]]) -> Agreement:
    for step, (a, b) in enumerate(zip(ours, reference_ids, strict=False)):
        if a != b:
            first, second = top2[step][0]["logprob"], top2[step][1]["logprob"]
            gap = abs(first - second)
            return Agreement(step, len(reference_ids), step, gap < NEAR_TIE, gap)
    if len(ours) < len(reference_ids):
        return Agreement(len(ours), len(reference_ids), len(ours), False, None)
    return Agreement(len(reference_ids), len(reference_ids), None, False, None)
