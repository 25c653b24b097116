"""Snapshots of a sequence: everything that determines what it computes next, saved and restored bit
for bit.

Owns: `SequenceSnapshot` (the tokens, each layer's committed keys and values with their positions,
and the recurrent states after the last token), `take_snapshot` and `restore_snapshot`. A sequence
restored from a snapshot continues exactly as the sequence it was taken from would: its next pass
reads the same cache bits and the same states (tests/runtime/test_recurrent_state.py). This is how a
recurrent model's state is kept at a point it cannot be cut back to (Warm Start stores these).
Does not own where snapshots are kept or when they are taken (kinetic/runtime/warm.py), nor the
cache and state layouts (kv_cache.py, recurrent.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from kinetic.runtime.engine import Engine, Sequence


@dataclass(frozen=True)
class SequenceSnapshot:
    tokens: tuple[int, ...]
    kv: dict[int, tuple[np.ndarray, np.ndarray]]  # layer -> keys, values [length, width], the cache dtype
    positions: np.ndarray  # i32 [length]
    recurrent: dict[str, np.ndarray]  # state name -> f32 [rows, width]: the state after the last token

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        arrays = [a for kv in self.kv.values() for a in kv] + list(self.recurrent.values()) + [self.positions]
        return sum(a.nbytes for a in arrays)


def take_snapshot(seq: Sequence) -> SequenceSnapshot:
    """A copy of the sequence's committed state (nothing held for keep() is part of it)."""
    cache, n = seq.cache, seq.cache.length
    if n != len(seq.tokens):
        raise ValueError(f"the sequence holds {len(seq.tokens)} tokens and its cache {n}")
    kv = {layer: (k.copy(), v.copy()) for layer in cache.layers() for k, v in [cache.committed(layer)[:2]]}
    return SequenceSnapshot(tuple(seq.tokens), kv, cache.positions[:n].copy(), cache.recurrent.copy_values())


def restore_snapshot(engine: Engine, snapshot: SequenceSnapshot) -> Sequence:
    """A new sequence of `engine` holding exactly what the snapshot saved."""
    seq = engine.new_sequence()
    n = snapshot.length
    if set(snapshot.kv) != set(seq.cache.layers()):
        raise ValueError("the snapshot's cache layers are not this model's")
    seq.cache.check_room(n)
    if n:
        seq.cache.commit(snapshot.kv, np.arange(n), snapshot.positions)
    seq.cache.recurrent.restore(snapshot.recurrent, n)
    seq.tokens.extend(snapshot.tokens)
    return seq
