"""Shortlist in the runtime: which requests may skip rows of the output layer, and what they get.

Owns: `rows_needed(picker, logprobs=...)`, the per-request decision: how many of the best logits a
token's choice depends on (1 for greedy, top_k for a chain whose stages before top-k change nothing,
0 for anything that needs the whole distribution). The row of logits such a
request is handed (by OutputHead.logits): the exact logits of every token that can be among those
best, -inf elsewhere.
Does not own the bound nor the kernels (kinetic/codegen/cpu/shortlist.py), nor the passes (engine.py).

Why the answer cannot change: the tokens left at -inf are proven (by the bound) to be strictly below
k tokens whose exact logits are present, so top-k keeps exactly the tokens it keeps from the full row
(ties included: a skipped token is never tied with the k-th), with their exact logits; every later
stage (typical, top-p, min-p, XTC, temperature, the pick) sees only top-k's output. A stage before
top-k that can lift a token or reorder the row (logit bias, penalties, DRY, top-n-sigma, which
reads every logit) or one that needs every logit (Mirostat, log-probabilities, a grammar's mask)
makes the request take the full layer.
"""

from __future__ import annotations

from kinetic.runtime.sampling import SamplingSettings

MAX_SHARE = 8  # a top-k above n_vocab / MAX_SHARE takes the full layer: the shortlist would not pay


def _stage_changes_nothing(stage: str, s: SamplingSettings) -> bool:
    """Whether a stage placed before top-k leaves the row as it is. (A temperature does not: dividing
    can round two logits to a tie that top-k breaks by id, letting a skipped token in.)"""
    inactive = {
        "penalties": s.repeat_last_n == 0 or (s.repeat_penalty == 1 and s.frequency_penalty == 0
                                              and s.presence_penalty == 0),
        "dry": s.dry_multiplier == 0 or s.dry_penalty_last_n == 0,
        "top_n_sigma": s.top_n_sigma <= 0,
        "typ_p": s.typical_p >= 1,
        "top_p": s.top_p >= 1,
        "min_p": s.min_p <= 0,
        "xtc": s.xtc_probability <= 0 or s.xtc_threshold > 0.5,
    }
    return inactive.get(stage, False)


def _argmax_only(s: SamplingSettings) -> bool:
    """The Sampler's own rule (sampler._argmax_only) for choosing the plain argmax of the raw logits:
    greedy, and no stage can change which token is likeliest (penalties and DRY checked apart)."""
    return (s.greedy and s.mirostat == 0 and "temperature" in s.samplers and not s.logit_bias
            and (s.typical_p >= 1 or "typ_p" not in s.samplers)
            and (s.xtc_probability <= 0 or s.xtc_threshold > 0.5 or "xtc" not in s.samplers))


def rows_needed(settings: SamplingSettings | None, *, logprobs: bool = False, grammar: bool = False,
                n_vocab: int) -> int:
    """How many best logits choosing a token depends on: 1 (greedy), k (top-k sampling), or 0 (the
    whole row: every other case). `settings` None is the greedy picker."""
    if logprobs or grammar:
        return 0
    if settings is None:
        return 1
    s = settings
    if s.mirostat or s.logit_bias:
        return 0
    if not _stage_changes_nothing("penalties", s) or not _stage_changes_nothing("dry", s):
        return 0
    if _argmax_only(s):
        return 1
    if "top_k" not in s.samplers or s.top_k <= 0 or s.top_k > n_vocab // MAX_SHARE:
        return 0
    before = s.samplers[:s.samplers.index("top_k")]
    return s.top_k if all(_stage_changes_nothing(stage, s) for stage in before) else 0


def picker_rows_needed(picker, *, logprobs: bool, n_vocab: int) -> int:
    """rows_needed for a picker: a Sampler (its settings), a grammar's ConstrainedSampler (0), the
    GreedyPicker (1), or a wrapper with a `picker` attribute (what it wraps)."""
    inner = getattr(picker, "picker", picker)
    if type(inner).__name__ == "ConstrainedSampler":
        return 0
    settings = getattr(inner, "settings", None)
    if settings is None and type(inner).__name__ != "GreedyPicker":
        return 0
    return rows_needed(settings, logprobs=logprobs, n_vocab=n_vocab)
