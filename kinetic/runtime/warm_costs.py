"""Warm Start's judgement: whether restoring a stored state is cheaper than recomputing its tokens.

Owns: the speeds Warm Start measures as it runs (seconds per prompt token computed, seconds per
byte restored from memory and from disk, each a moving average of what was observed) and the rule
that compares them. Does not own the states (kinetic/runtime/warm.py) nor the passes.

Before anything is measured a restore counts as cheaper: copying rows is orders of magnitude faster
than computing them on every device Kinetic runs on (a 135M model's KV cache takes ~23 KB per token;
memory copies it at gigabytes per second, a CPU computes it at thousands of tokens per second), so
the first guess is right and the averages take over after one observation of each.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

MEMORY, DISK = "memory", "disk"
_WEIGHT = 0.3  # how much a new observation moves an average


def _moved(average: float | None, value: float) -> float:
    return value if average is None else (1 - _WEIGHT) * average + _WEIGHT * value


@dataclass
class RestoreCosts:
    """Measured speeds: prompt computation per token, restores per byte for each tier."""

    prefill_per_token: float | None = None  # seconds
    restore_per_byte: dict[str, float] = field(default_factory=dict)  # tier -> seconds
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """A prompt's computed part: `tokens` rows took `seconds` (waiting included, as a request sees it)."""
        if tokens > 0 and seconds > 0:
            with self.lock:
                self.prefill_per_token = _moved(self.prefill_per_token, seconds / tokens)

    def observe_restore(self, tier: str, nbytes: int, seconds: float) -> None:
        if nbytes > 0 and seconds > 0:
            with self.lock:
                self.restore_per_byte[tier] = _moved(self.restore_per_byte.get(tier), seconds / nbytes)

    def worth(self, tier: str, tokens: int, nbytes: int) -> bool:
        """Restoring `nbytes` from `tier` costs less than computing `tokens` prompt rows (True until
        both speeds have been measured)."""
        if tokens <= 0:
            return False
        with self.lock:
            per_byte, per_token = self.restore_per_byte.get(tier), self.prefill_per_token
        if per_byte is None or per_token is None:
            return True
        return nbytes * per_byte < tokens * per_token


SNAPSHOT_EVERY = 256  # tokens between a recurrent model's stored snapshots, at the least
MIN_ROW_BYTES = 1024  # what a token's stretch counts as at the least (a model without attention has no rows)


def snapshot_interval(*, state_bytes: int, row_bytes: int, batch: int) -> int:
    """Tokens between a recurrent model's stored snapshots: every SNAPSHOT_EVERY tokens (a multiple
    of the batch, so a snapshot point is a grid point), or the smallest multiple of that whose KV
    rows (`row_bytes` a token, at least MIN_ROW_BYTES) outweigh the snapshot's recurrent states
    (`state_bytes`): a snapshot is never large next to the stretch of prompt it saves."""
    step = math.lcm(SNAPSHOT_EVERY, batch)
    return step * max(1, math.ceil(state_bytes / (step * max(row_bytes, MIN_ROW_BYTES))))
