"""Mirostat 1 and 2: truncate the candidates by a target surprise mu, which each token updates.

Pure functions; the Sampler holds mu (starting at 2 * tau, as llama.cpp resets it) and, after each
accepted token, sets mu -= eta * (surprise - tau), where surprise = -log2 p(token) under the
truncated, renormalized distribution the token was chosen from (llama.cpp
`llama_sampler_mirostat_apply` / `_v2_apply`, which update mu right after their own draw).
"""

from __future__ import annotations

import math

import numpy as np

from kinetic.runtime.sampling.filters import Candidates, canonical_order, log_softmax, top_k

MIROSTAT_M = 100  # llama.cpp's m: how many top tokens estimate the Zipf exponent


def mirostat_v1(ids: np.ndarray, logits: np.ndarray, mu: float, n_vocab: int) -> Candidates:
    """Mirostat 1 (Basu et al., 2020): estimate the Zipf exponent s from the top m tokens, then keep
    the top k with k = (eps * 2^mu / (1 - N^-eps))^(1/s), eps = s - 1, N = the vocabulary size."""
    if len(logits) <= 1:
        return ids, logits
    top_ids, top_logits = top_k(ids, logits, MIROSTAT_M)
    ordered = top_logits[canonical_order(top_logits)].astype(np.float64)
    i = np.arange(len(ordered) - 1, dtype=np.float64)
    t = np.log((i + 2) / (i + 1))
    with np.errstate(all="ignore"):  # overflow, 0/0 and -inf - -inf (masked logits) give inf/nan, not warnings
        b = ordered[:-1] - ordered[1:]  # log(p_i / p_{i+1}): the normalizer cancels
        s_hat = np.sum(t * b) / np.sum(t * t)
        eps = s_hat - 1
        k = float((eps * np.float64(2.0) ** mu / (1 - np.float64(n_vocab) ** -eps)) ** (1 / s_hat))
    if not math.isfinite(k) or k >= len(logits):  # llama.cpp: int() of a NaN; keep all
        return ids, logits
    return top_k(ids, logits, max(int(k), 1))


def mirostat_v2(ids: np.ndarray, logits: np.ndarray, mu: float) -> Candidates:
    """Mirostat 2: keep the tokens whose surprise -log2 p is at most mu (at least the likeliest)."""
    if len(logits) <= 1:
        return ids, logits
    keep = np.flatnonzero(log_softmax(logits) >= -mu * math.log(2))
    if not len(keep):
        keep = np.array([int(np.argmax(logits))])
    return ids[keep], logits[keep]


def surprise(ids: np.ndarray, logits: np.ndarray, token: int) -> float:
    """-log2 p(token) under softmax(logits); inf when the token is not a candidate."""
    pos = int(np.searchsorted(ids, token))
    if pos >= len(ids) or ids[pos] != token:
        return math.inf
    return -float(log_softmax(logits)[pos]) / math.log(2)
