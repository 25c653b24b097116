"""The samplers as pure functions over candidates: `(ids, logits) -> (ids, logits)`.

Candidates are two arrays of one length: token ids (int64, always ascending) and their logits (the
engine's float32, or float64). Logits keep their dtype, so arithmetic on them (bias, penalties,
temperature) is done in float32 as llama.cpp does it, while every probability (softmax, running sums,
the pick) is worked out in float64. A sampler never changes its inputs; one that has nothing to do
returns them as they are.
Where an order matters (top-p, typical, XTC, the final pick), it is the canonical one: descending
logit, ties by ascending token id, so the answer never depends on how an array happened to be laid
out. Meanings follow llama.cpp's src/llama-sampler.cpp; where Kinetic differs it says so.
"""

from __future__ import annotations

import math

import numpy as np

Candidates = tuple[np.ndarray, np.ndarray]

_HEAD = 64  # how many of the best tokens top-p and the pick look at before they widen (x16)


def canonical_order(logits: np.ndarray) -> np.ndarray:
    """Positions by descending logit, ties by position (= ascending id, as ids are ascending)."""
    return np.argsort(-logits, kind="stable")


def head(logits: np.ndarray, m: int) -> np.ndarray:
    """The first m positions of canonical_order(logits), without sorting the rest.

    A full sort or argpartition of 262k logits takes ~2-20 ms, so a prefilter goes first: split
    the logits into G >= 4m interleaved groups and take the m-th largest of the G group maxima, t.
    Those m maxima are m distinct logits >= t, so the m-th largest logit overall is >= t and every
    one of the best m has logit >= t. Only those (usually a few dozen) are then sorted.
    """
    n = len(logits)
    if m >= n:
        return canonical_order(logits)
    if m <= 0:
        return np.zeros(0, dtype=np.int64)
    groups = max(1024, 1 << (4 * m - 1).bit_length())
    positions = None
    if n >= 4 * groups:
        group_max = logits[: n // groups * groups].reshape(-1, groups).max(axis=0)
        threshold = np.partition(group_max, groups - m)[groups - m]
        found = np.flatnonzero(logits >= threshold)
        if len(found) >= m:  # (NaN logits: no shortcut)
            positions = found
    if positions is None:
        return canonical_order(logits)[:m]
    return positions[np.argsort(-logits[positions], kind="stable")[:m]]  # stable: ties by position = id


# Over a whole vocabulary these helpers keep a single f64 array alive and work in place: with two
# 2 MiB temporaries at once, glibc returns the freed heap to the system after every call and the
# next call page-faults it back, which measured 10x slower (3.6 ms instead of 0.3 ms on 262k).

def exp_weights(logits: np.ndarray) -> np.ndarray:
    """f64 exp(logit - max logit), in a new array."""
    w = np.array(logits, dtype=np.float64)
    w -= w.max()
    return np.exp(w, out=w)


def softmax(logits: np.ndarray) -> np.ndarray:
    """f64 probabilities of any float logits."""
    w = exp_weights(logits)
    w /= w.sum()
    return w


def _keep(ids: np.ndarray, logits: np.ndarray, positions: np.ndarray) -> Candidates:
    positions = np.sort(positions)
    return ids[positions], logits[positions]


def _locate(ids: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of `tokens` among the candidates, and which of them are candidates at all."""
    n = len(ids)
    if n and ids[-1] == n - 1:  # ascending, unique and ending at n-1: ids is arange(n)
        found = (tokens >= 0) & (tokens < n)
        return np.where(found, tokens, 0), found
    pos = np.minimum(np.searchsorted(ids, tokens), max(n - 1, 0))
    return pos, (ids[pos] == tokens) if n else np.zeros(len(tokens), bool)


def logit_bias(ids: np.ndarray, logits: np.ndarray, tokens: np.ndarray, biases: np.ndarray) -> Candidates:
    """logit[t] += bias[t] for every (t, bias) pair (a token listed twice gets both, as in llama.cpp)."""
    if not len(tokens):
        return ids, logits
    pos, found = _locate(ids, tokens)
    out = logits.copy()
    np.add.at(out, pos[found], biases[found])
    return ids, out


def penalties(ids: np.ndarray, logits: np.ndarray, window: np.ndarray, repeat: float, frequency: float,
              presence: float) -> Candidates:
    """Repeat, frequency and presence penalties over the tokens of `window` (the last repeat_last_n).

    For a token seen c > 0 times (llama.cpp `llama_sampler_penalties_apply`):
        logit = logit * repeat if logit <= 0 else logit / repeat     # always toward less likely
        logit -= c * frequency + presence
    """
    if not len(window) or (repeat == 1.0 and frequency == 0.0 and presence == 0.0):
        return ids, logits
    tokens, counts = np.unique(window, return_counts=True)
    pos, found = _locate(ids, tokens)
    pos, counts = pos[found], counts[found]
    seen = logits[pos]
    seen = np.where(seen <= 0, seen * repeat, seen / repeat) - (counts * frequency + presence)
    out = logits.copy()
    out[pos] = seen
    return ids, out


def top_n_sigma(ids: np.ndarray, logits: np.ndarray, n: float) -> Candidates:
    """Keep tokens whose logit is at least max - n * std (mean and population std over the finite
    logits). llama.cpp sets the rest to -inf; dropping them gives the same distribution."""
    if n <= 0 or len(logits) <= 1:
        return ids, logits
    finite = logits != -np.inf
    z = np.array(logits if finite.all() else logits[finite], dtype=np.float64)
    if not len(z):
        return ids, logits
    top = z.max()
    z -= z.mean()
    np.square(z, out=z)
    keep = np.flatnonzero(logits >= top - n * math.sqrt(z.mean()))
    return ids[keep], logits[keep]


def top_k(ids: np.ndarray, logits: np.ndarray, k: int) -> Candidates:
    """The k highest logits, ties by lowest id. k <= 0 keeps all."""
    if k <= 0 or k >= len(logits):
        return ids, logits
    return _keep(ids, logits, head(logits, k))


def _first_reaching(weights: np.ndarray, logits: np.ndarray, target: float, side: str) -> tuple[np.ndarray, int]:
    """In canonical order, the index of the first running sum of `weights` >= target (side "left")
    or > target ("right"), with the order's head that holds it. The running sums are those of the
    full order, so widening the head never changes the answer. Index len(order) means never."""
    m = _HEAD
    while True:
        order = head(logits, m)
        index = int(np.searchsorted(np.cumsum(weights[order]), target, side=side))
        if index < len(order) or len(order) == len(logits):
            return order, index
        m *= 16


def typical(ids: np.ndarray, logits: np.ndarray, p: float) -> Candidates:
    """Locally typical sampling: by |surprise - entropy| ascending (stable over the canonical
    order), keep the shortest run whose probabilities add up to more than p. p >= 1 is off.
    A zero probability adds nothing to the entropy (llama.cpp would make it NaN)."""
    if p >= 1.0 or len(logits) <= 1:
        return ids, logits
    order = canonical_order(logits)
    probs = softmax(logits[order])
    with np.errstate(divide="ignore", invalid="ignore"):
        surprise = -np.log(probs)
        entropy = float(np.sum(np.where(probs > 0, probs * surprise, 0.0)))
        shifted = np.abs(surprise - entropy)
    by_typicality = np.argsort(shifted, kind="stable")
    cumulative = np.cumsum(probs[by_typicality])
    count = int(np.searchsorted(cumulative, p, side="right")) + 1  # first running sum > p, inclusive
    return _keep(ids, logits, order[by_typicality[:count]])


def top_p(ids: np.ndarray, logits: np.ndarray, p: float) -> Candidates:
    """Nucleus: in canonical order, keep the shortest prefix whose probabilities add up to at least p.
    p >= 1 is off."""
    if p >= 1.0 or len(logits) <= 1:
        return ids, logits
    order, index = _first_reaching(softmax(logits), logits, p, "left")
    return _keep(ids, logits, order[: index + 1])  # the first running sum >= p, inclusive


def min_p(ids: np.ndarray, logits: np.ndarray, p: float) -> Candidates:
    """Keep tokens at least p times as likely as the likeliest: logit >= max + ln p. p <= 0 is off;
    the likeliest token always stays."""
    if p <= 0.0 or len(logits) <= 1:
        return ids, logits
    top = logits.max()
    keep = np.flatnonzero(logits >= top + math.log(p))
    if not len(keep):
        keep = np.array([int(np.argmax(logits))])
    return ids[keep], logits[keep]


def xtc_coin(u: float, probability: float) -> tuple[bool, float]:
    """XTC's coin from the token's one uniform, and a fresh uniform for the pick.

    llama.cpp draws XTC's coin from a second generator. Kinetic keeps one uniform per token and
    splits it: the coin says "apply" when u < probability, and the rest of u, rescaled to [0, 1),
    goes on to the pick (u / probability, or (u - probability) / (1 - probability)). Given either
    outcome the rescaled value is uniform and independent of the coin, so the mixture
    probability * p_xtc + (1 - probability) * p_plain is exact, and the answer still depends only
    on the seed, the settings and the token's index.
    """
    if probability >= 1.0:
        return True, u
    if u < probability:
        return True, u / probability
    return False, (u - probability) / (1.0 - probability)


def xtc(ids: np.ndarray, logits: np.ndarray, threshold: float) -> Candidates:
    """Exclude Top Choices: when two or more tokens have probability >= threshold, drop all of them
    but the least likely (llama.cpp `llama_sample_xtc_apply`, with min_keep 0)."""
    if threshold > 0.5 or len(logits) < 2:
        return ids, logits
    probs = softmax(logits)
    # At most 1/threshold tokens can have p >= threshold; they are a prefix of the canonical order.
    m = len(logits) if threshold <= 0 else min(len(logits), int(1 / threshold) + 2)
    order = head(logits, m)
    above = int(np.searchsorted(-probs[order], -threshold, side="right"))
    if above == len(order) < len(logits):  # rounding let more qualify than 1/threshold allows
        order = canonical_order(logits)
        above = int(np.searchsorted(-probs[order], -threshold, side="right"))
    if above < 2:
        return ids, logits
    keep = np.ones(len(logits), bool)
    keep[order[: above - 1]] = False
    return ids[keep], logits[keep]


def temperature(ids: np.ndarray, logits: np.ndarray, t: float) -> Candidates:
    """logits / t; t <= 0 keeps only the likeliest token (lowest id on ties)."""
    if t <= 0:
        best = int(np.argmax(logits))
        return ids[best:best + 1], logits[best:best + 1]
    if t == 1.0:
        return ids, logits
    return ids, logits / t


def pick(ids: np.ndarray, logits: np.ndarray, u: float) -> int:
    """The inverse CDF of u over softmax(logits), in canonical order: the first token whose running
    weight exp(logit - max) exceeds u * total, total being numpy's sum of the weights in id order.
    (If rounding puts that past the end, the last token of nonzero weight.) A candidate set with no
    finite logit gives its likeliest, lowest-id token."""
    if len(ids) == 1:
        return int(ids[0])
    if not np.isfinite(logits.max()):
        return int(ids[int(np.argmax(logits))])
    weights = exp_weights(logits)
    order, index = _first_reaching(weights, logits, u * weights.sum(), "right")
    if index == len(order):
        index = int(np.flatnonzero(weights[order] > 0)[-1])
    return int(ids[order[index]])


# -- log-probabilities of the raw logits (llama-server reports these, before any sampler) -----------

def log_softmax(logits: np.ndarray) -> np.ndarray:
    """f64 log-probabilities: logit - max - log(sum exp(logit - max)), the sum taken in 64k chunks."""
    z = np.array(logits, dtype=np.float64)
    z -= z.max()
    total = sum(float(np.exp(z[i:i + 65536]).sum()) for i in range(0, len(z), 65536))
    z -= math.log(total)
    return z


def top_logprobs(logits: np.ndarray, n: int) -> list[tuple[int, float]]:
    """The n likeliest tokens of the raw logits with their log-probabilities, likeliest first
    (ties by lowest id)."""
    logprobs = log_softmax(logits)
    return [(int(t), float(logprobs[t])) for t in head(logprobs, max(n, 0))]
