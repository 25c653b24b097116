"""Comparing greedy tokens with a reference engine's (llama.cpp's golden data), up to near-ties.

A reference step is a near-tie when its two likeliest tokens are within NEAR_TIE nats: another
correct engine that rounds differently may pick the other one, after which the texts legitimately
differ. Agreement is counted up to the first divergence; a divergence at a near-tie is acceptable.

The reference's own gap is itself rounded: llama.cpp's float32 orders can widen or narrow it by a
few tenths of a nat over a long prompt (docs/numerics.md, "Conformance against the float64 truth").
So a divergence is also acceptable when a float64 ground truth (the same quantized weights and
activation quantization, exact arithmetic elsewhere: benchmarks/perplexity_f64.py, variant "actq")
computed at that one step puts the reference's token less than NEAR_TIE above ours, or picks ours:
`with_truth`. The truth is computed by the caller, only at the divergence step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

NEAR_TIE = 0.1


@dataclass(frozen=True)
class Agreement:
    agreed: int  # tokens equal before the first divergence
    total: int  # reference tokens
    diverged_at: int | None  # step of the first divergence, None when all agree
    near_tie: bool  # the divergence happened at a near-tie of the reference (acceptable)
    gap: float | None  # the reference's top-2 log-probability gap at the divergence
    ours: int | None = None  # our token at the divergence
    theirs: int | None = None  # the reference's token at the divergence
    truth_gap: float | None = None  # float64 truth's logit(theirs) - logit(ours) there, when computed

    @property
    def truth_accepts(self) -> bool:
        """The float64 truth puts the reference's token less than NEAR_TIE above ours (or below it)."""
        return self.truth_gap is not None and self.truth_gap < NEAR_TIE

    @property
    def ok(self) -> bool:
        return self.diverged_at is None or self.near_tie or self.truth_accepts

    @property
    def needs_truth(self) -> bool:
        """A token divergence the reference's own gap does not excuse, and no truth computed yet."""
        return self.ours is not None and not self.near_tie and self.truth_gap is None


def compare(ours: list[int], reference_ids: list[int], top2: list[list[dict]]) -> Agreement:
    for step, (a, b) in enumerate(zip(ours, reference_ids, strict=False)):
        if a != b:
            first, second = top2[step][0]["logprob"], top2[step][1]["logprob"]
            gap = abs(first - second)
            return Agreement(step, len(reference_ids), step, gap < NEAR_TIE, gap, int(a), int(b))
    if len(ours) < len(reference_ids):
        return Agreement(len(ours), len(reference_ids), len(ours), False, None)
    return Agreement(len(reference_ids), len(reference_ids), None, False, None)


def with_truth(result: Agreement, truth_logits: np.ndarray) -> Agreement:
    """`result` with the float64 ground truth's logits [n_vocab] at its divergence step applied: the
    gap logit(theirs) - logit(ours), a difference of logits being one of log-probabilities."""
    assert result.ours is not None and result.theirs is not None, "no token divergence to judge"
    return replace(result, truth_gap=float(truth_logits[result.theirs]) - float(truth_logits[result.ours]))
