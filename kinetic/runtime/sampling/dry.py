"""DRY ("Don't Repeat Yourself"): penalize the token that would extend a repetition of the context.

Meaning as llama.cpp's `llama_sampler_dry_apply` (ported there from KoboldCpp, PR 982 by pi6am):
for every earlier place where the context's last n tokens already occurred (n capped by the last
sequence breaker), the token that followed that place would extend the repetition to n + 1; if
n >= allowed_length it loses multiplier * base ** (n - allowed_length) from its logit (the exponent
capped so the penalty stays a finite float). Tokens that contain a whole breaker are never penalized.

Sequence breakers are strings, matched on token text (the vocabulary's pieces, as bytes):
  * a token whose text contains a breaker is a breaker by itself;
  * a token whose text ends with the start of a breaker is one when the text of the tokens after it
    begins with the rest (at most 20 tokens, llama.cpp's MAX_SEQ_LEN; breakers are cut to 40 bytes).
llama.cpp instead requires those following tokens to be exactly the tokenizer's tokenization of
the rest; matching text also catches the other spellings of the same string.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kinetic.runtime.sampling.filters import Candidates, _locate

MAX_BREAKER_BYTES = 40  # llama.cpp MAX_CHAR_LEN
MAX_TAIL_TOKENS = 20    # llama.cpp MAX_SEQ_LEN
_FLOAT_MAX_LOG = 88.7228391  # ln(FLT_MAX), as llama.cpp caps the exponent
_CACHE_SIZE = 4
_CACHE: dict[tuple[int, tuple[str, ...]], tuple[Sequence, BreakerIndex]] = {}


@dataclass(frozen=True)
class BreakerIndex:
    """Which tokens start a sequence breaker: head token -> the text that must follow (b"" when
    the token holds a whole breaker), and the pieces to read the following tokens' text from."""

    heads: dict[int, tuple[bytes, ...]]
    pieces: Sequence[bytes]

    @classmethod
    def build(cls, pieces: Sequence[bytes | str], breakers: Sequence[str]) -> BreakerIndex:
        if not all(isinstance(p, bytes) for p in pieces):
            pieces = [p.encode("utf-8") if isinstance(p, str) else bytes(p) for p in pieces]
        heads: dict[int, set[bytes]] = {}
        for breaker in breakers:
            b = breaker.encode("utf-8")[:MAX_BREAKER_BYTES]
            if not b:
                continue
            for token in [t for t, piece in enumerate(pieces) if b in piece]:
                heads.setdefault(token, set()).add(b"")
            starts = tuple(b[:n] for n in range(1, len(b)))  # a token may end with the breaker's start
            if not starts:
                continue
            for token in [t for t, piece in enumerate(pieces) if piece.endswith(starts) and b not in piece]:
                heads.setdefault(token, set()).update(b[n:] for n in range(1, len(b)) if pieces[token].endswith(b[:n]))
        return cls({t: tuple(sorted(r)) for t, r in heads.items()}, pieces)

    @classmethod
    def cached(cls, pieces: Sequence[bytes | str], breakers: Sequence[str]) -> BreakerIndex:
        """build(), remembered for the last few (vocabulary object, breakers): building scans every
        token (~0.2 s on a 262k vocabulary), which a request should not pay each time."""
        key = (id(pieces), tuple(breakers))
        hit = _CACHE.get(key)
        if hit is not None and hit[0] is pieces:  # the entry holds `pieces`, so its id is not reused
            return hit[1]
        index = cls.build(pieces, breakers)
        if len(_CACHE) >= _CACHE_SIZE:
            del _CACHE[next(iter(_CACHE))]
        _CACHE[key] = (pieces, index)
        return index

    def whole(self, token: int) -> bool:
        return b"" in self.heads.get(token, ())


def repeat_limit(window: np.ndarray, index: BreakerIndex) -> int:
    """How far back a repetition may reach: up to the most recent complete breaker (llama.cpp's
    rep_limit: i - tail length, for the breaker whose head is i tokens from the end)."""
    n = len(window)
    if not index.heads:
        return n
    is_head = np.fromiter((int(t) in index.heads for t in window), bool, n)
    for start in np.flatnonzero(is_head)[::-1]:
        i = n - 1 - int(start)  # tokens after the head
        tails = [_tail_tokens(window, int(start), rest, index.pieces) for rest in index.heads[int(window[start])]]
        matched = [t for t in tails if t is not None]
        if matched:
            return i - max(matched)
    return n


def _tail_tokens(window: np.ndarray, head: int, rest: bytes, pieces: Sequence[bytes]) -> int | None:
    """How many tokens after window[head] spell `rest` (their text starts with it), or None."""
    if not rest:
        return 0
    text = b""
    for count, token in enumerate(window[head + 1: head + 1 + MAX_TAIL_TOKENS], start=1):
        text += pieces[int(token)]
        if len(text) >= len(rest):
            return count if text.startswith(rest) else None
    return None


def repeat_lengths(window: np.ndarray, limit: int) -> np.ndarray:
    """For each position e < n - 1: how many tokens ending at e equal the window's last tokens
    (capped at `limit`). llama.cpp computes this with a reversed Z-algorithm; here each step
    narrows the set of positions still matching, all positions at once."""
    n = len(window)
    lengths = np.zeros(max(n - 1, 0), dtype=np.int64)
    alive = np.arange(n - 1)
    step = 0
    while len(alive) and step < limit:
        earlier = alive - step
        alive = alive[(earlier >= 0) & (window[np.maximum(earlier, 0)] == window[n - 1 - step])]
        lengths[alive] += 1
        step += 1
    return lengths


def dry(ids: np.ndarray, logits: np.ndarray, window: np.ndarray, index: BreakerIndex, multiplier: float,
        base: float, allowed_length: int) -> Candidates:
    """The DRY penalty given the last dry_penalty_last_n tokens of the context (`window`)."""
    if multiplier == 0.0 or base < 1.0 or len(window) <= allowed_length:
        return ids, logits
    limit = repeat_limit(window, index)
    if limit < allowed_length:
        return ids, logits
    lengths = repeat_lengths(window, limit)
    ends = np.flatnonzero(lengths >= allowed_length)
    if not len(ends):
        return ids, logits
    following = window[ends + 1]
    longest: dict[int, int] = {}
    for token, length in zip(following.tolist(), lengths[ends].tolist(), strict=True):
        if length > longest.get(token, -1) and not index.whole(token):
            longest[token] = length
    if not longest:
        return ids, logits
    tokens = np.fromiter(longest, np.int64, len(longest))
    exponents = np.fromiter(longest.values(), np.float64, len(longest)) - allowed_length
    max_exponent = int(_FLOAT_MAX_LOG / math.log(base)) if base > 1.000001 else 0
    if max_exponent > 0:
        exponents = np.minimum(exponents, max_exponent)
    pos, found = _locate(ids, tokens)
    out = logits.copy()
    out[pos[found]] -= multiplier * base ** exponents[found]
    return ids, out
