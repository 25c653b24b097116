"""RAD-1's n-gram index: where earlier occurrences of the context's last few tokens are, in bounded memory.

Owns: the hash of an n-gram (scalar and vectorized, the same values), and NgramIndex, a ring of the
last `budget` tokens with, per n-gram length, hash chains through every position where an n-gram
ends (zlib's hash chains), and the lookup of continuations. Hand-written because the lookup must
run per decode step in microseconds over a fixed budget of memory, which no well-kept library's
suffix structure offers. Does not own which index a drafter uses, nor the policy
(kinetic/runtime/drafting.py), nor verification (kinetic/runtime/speculative.py).
"""

from __future__ import annotations

import threading

import numpy as np

# n-gram lengths looked up, longest first (docs/rad1.md: measured). 8 finds the earlier occurrence a
# repeated span continues from where 4 tokens are ambiguous (a loop whose halves differ in one token)
CONTEXT_ORDERS = (8, 4, 3, 2)
MAX_BRANCHES = 3  # distinct continuations per lookup
MAX_CHAIN = 16  # earlier occurrences examined per lookup

_MASK = (1 << 64) - 1
_MUL = 0x100000001B3
_MIX = 0x9E3779B97F4A7C15


def _slot(tokens: list[int], bits: int) -> int:
    """The hash slot of an n-gram (the same value as _slots computes for a whole array)."""
    h = len(tokens)
    for t in tokens:
        h = (h * _MUL + t + 1) & _MASK
    return ((h * _MIX) & _MASK) >> (64 - bits)


def _slots(windows: np.ndarray, bits: int) -> np.ndarray:
    """windows i64 [m, n] -> uint64 [m] hash slots; uint64 arithmetic wraps as the & _MASK above."""
    h = np.full(len(windows), windows.shape[1], np.uint64)
    for j in range(windows.shape[1]):
        h = h * np.uint64(_MUL) + (windows[:, j] + 1).astype(np.uint64)
    return (h * np.uint64(_MIX)) >> np.uint64(64 - bits)


class NgramIndex:
    """The last `budget` tokens appended, and for each order n a hash chain through every position
    where an n-gram ends, newest first (zlib's hash chains). Memory is fixed at construction:
    older tokens are overwritten in the ring and chains stop at the first overwritten entry."""

    def __init__(self, budget: int, orders=CONTEXT_ORDERS, slot_bits: int | None = None):
        self.budget = budget
        self.orders = tuple(sorted(orders, reverse=True))
        self.bits = slot_bits or max(8, (budget - 1).bit_length())
        self.ring = np.zeros(budget, np.int32)  # token at global position p lives at p % budget
        self.head = np.full((len(self.orders), 1 << self.bits), -1, np.int64)  # newest end position
        self.back = np.zeros((len(self.orders), budget), np.int32)  # distance to the previous one, 0: none
        self.total = 0  # tokens ever appended
        self.lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self.ring.nbytes + self.head.nbytes + self.back.nbytes

    def extend(self, tokens) -> None:
        if len(tokens) <= 4:  # a decode step's few tokens: scalar updates beat a dozen numpy calls
            for token in tokens:
                self._append(int(token))
            return
        tokens = np.asarray(tokens, np.int64)
        if len(tokens) > self.budget:  # only the newest budget tokens can stay
            self.total += len(tokens) - self.budget
            tokens = tokens[-self.budget:]
            tail = np.zeros(0, np.int64)
        else:
            keep = min(self.orders[0] - 1, self.total, self.budget - len(tokens))
            tail = self._tokens_array(self.total - keep, self.total)
        start = self.total
        self.ring[np.arange(start, start + len(tokens)) % self.budget] = tokens
        self.total += len(tokens)
        window = np.concatenate([tail, tokens])  # global positions start - len(tail) ...
        for o, n in enumerate(self.orders):
            first = max(n - 1, len(tail))  # window index of the first new n-gram end
            if first >= len(window):
                continue
            ends = np.arange(first, len(window))
            grams = window[ends[:, None] - np.arange(n - 1, -1, -1)]  # i64 [m, n]
            self._link(o, _slots(grams, self.bits), ends + (start - len(tail)))

    def _append(self, token: int) -> None:
        """extend() of one token, the same updates one at a time."""
        pos = self.total
        self.ring[pos % self.budget] = token
        self.total += 1
        for o, n in enumerate(self.orders):
            if pos - n + 1 < max(0, self.total - self.budget):
                continue
            slot = _slot(self._tokens(pos - n + 1, pos + 1), self.bits)
            prev = int(self.head[o, slot])
            self.back[o, pos % self.budget] = pos - prev if 0 <= prev and pos - prev < self.budget else 0
            self.head[o, slot] = pos

    def _link(self, o: int, slots: np.ndarray, positions: np.ndarray) -> None:
        """Put positions (increasing) at the head of their slots' chains."""
        order = np.argsort(slots, kind="stable")
        s, p = slots[order].astype(np.int64), positions[order]
        new_group = np.r_[True, s[1:] != s[:-1]]
        prev = np.empty_like(p)
        prev[1:] = p[:-1]
        prev[new_group] = self.head[o, s[new_group]]
        dist = p - prev
        self.back[o, p % self.budget] = np.where((prev >= 0) & (dist < self.budget), dist, 0)
        last = np.r_[s[1:] != s[:-1], True]
        self.head[o, s[last]] = p[last]

    def _tokens_array(self, a: int, b: int) -> np.ndarray:
        return self.ring.take(np.arange(a, b), mode="wrap").astype(np.int64)

    def _tokens(self, a: int, b: int) -> list[int]:
        i = a % self.budget
        if i + (b - a) <= self.budget:
            return self.ring[i : i + b - a].tolist()
        return self._tokens_array(a, b).tolist()

    def continuations(self, query: list[int], max_len: int) -> tuple[int, list[list[int]]]:
        """For the longest order n whose last n query tokens occurred with something after them:
        (n, up to MAX_BRANCHES continuations of up to max_len tokens with distinct first tokens,
        newest occurrence first). (0, []) when none."""
        oldest = self.total - self.budget
        for o, n in enumerate(self.orders):
            if len(query) < n:
                continue
            key = query[-n:]
            pos, branches, firsts = int(self.head[o, _slot(key, self.bits)]), [], set()
            for _ in range(MAX_CHAIN):
                if pos < 0 or pos - n + 1 < oldest:
                    break
                if pos + 1 < self.total and self._tokens(pos - n + 1, pos + 1) == key:
                    cont = self._tokens(pos + 1, min(pos + 1 + max_len, self.total))
                    if cont[0] not in firsts:
                        firsts.add(cont[0])
                        branches.append(cont)
                        if len(branches) == MAX_BRANCHES:
                            break
                step = int(self.back[o, pos % self.budget])
                if step == 0:
                    break
                pos -= step
            if branches:
                return n, branches
        return 0, []
