"""Recurrent state: per sequence, the state each recurrent layer carries instead of a KV cache.

Owns: `RecurrentState` (per state name of the graph, f32 [rows, width], the state after the
sequence's last committed token), what replaces rollback for it, and `recurrent_shapes` (the states
a graph names). A recurrent state cannot be cut back to an earlier length as a KV cache can, so:

* a pass's runner returns the state after each row the runtime may keep (PassResult.new_state, along
  the row's own path; `state_rows` names them: a commit's last row per sequence, every row of a
  draft tree); committing rows keeps the state after the last of them, and a verified draft tree's
  held states give keep() the state after the last kept row: rejected rows leave no trace;
* checkpoints: the state is copied after a commit that reaches or passes a multiple of
  `checkpoint_every` (the zero state at 0 always exists); `rewind(length)` restores the latest
  checkpoint at or before `length` and says which, and the engine feeds the tokens between again
  (Engine.rollback), which batch invariance makes bit for bit the state it had there.

Does not own the KV cache (kv_cache.py; a KVCache carries its sequence's RecurrentState as
`recurrent`), what a layer computes (kinetic/ir/reference.py), nor whole-sequence snapshots
(snapshots.py).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

import numpy as np

from kinetic.ir.graph import Graph
from kinetic.ir.ops import Op
from kinetic.ir.rows import PassRows

CHECKPOINT_EVERY = 256  # tokens between checkpoints: the longest stretch a rollback feeds again
MAX_CHECKPOINTS = 4  # the latest ones kept (the zero state at 0 is always there): each is a whole state


def state_rows(rows: PassRows, *, held: Collection[int] = ()) -> PassRows:
    """`rows` naming the rows whose states the runtime will keep (PassRows.state_rows): each
    sequence's last row (a commit keeps the state after it), and every row of the sequences in
    `held` (a draft tree's, until keep()). The runner then returns no other row's state, which for a
    prompt chunk of a model with large states (Mamba's) is most of the pass's memory."""
    last = {int(s): r for r, s in enumerate(rows.seqs)}
    keep = {r for r, s in enumerate(rows.seqs) if int(s) in held} | set(last.values())
    return replace(rows, state_rows=np.array(sorted(keep), np.int64))


def part_states(new_state: dict[str, dict[int, np.ndarray]], mine: np.ndarray) -> dict[str, dict[int, np.ndarray]]:
    """One part's row states of a shared pass, renumbered as its own rows (pass row mine[i] -> i)."""
    return {name: {i: states[int(r)] for i, r in enumerate(mine) if int(r) in states}
            for name, states in new_state.items()}


def recurrent_shapes(graph: Graph) -> dict[str, tuple[int, int]]:
    """State name -> (rows, width) for every recurrent_state node of the graph."""
    return {n.attrs.name: tuple(n.type.shape) for n in graph.nodes if n.op is Op.RECURRENT_STATE}


class RecurrentState:
    """One sequence's recurrent states; `values[name]` is the state after `length` committed tokens."""

    def __init__(self, shapes: dict[str, tuple[int, int]], checkpoint_every: int = CHECKPOINT_EVERY):
        self.shapes = dict(shapes)
        self.values = {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}
        self.length = 0
        self.checkpoint_every = checkpoint_every
        self.checkpoints: dict[int, dict[str, np.ndarray]] = {}
        self._held: tuple[int, dict[str, np.ndarray]] | None = None  # (length, states) of a verify pass

    def __bool__(self) -> bool:
        return bool(self.shapes)

    def commit(self, new_state: dict[str, dict[int, np.ndarray]], rows: np.ndarray) -> None:
        """Append pass rows `rows` (one sequence's, in path order): the state becomes the one after the
        last of them; a checkpoint is taken when the length reaches or passes a multiple of
        checkpoint_every."""
        rows = np.asarray(rows, np.int64)
        n = len(rows)
        if self.shapes and n:
            self.values = {name: np.array(new_state[name][int(rows[-1])], np.float32) for name in self.shapes}
            if (self.length + n) // self.checkpoint_every > self.length // self.checkpoint_every:
                self._checkpoint(self.length + n, self.values)
        self.length += n

    def hold(self, new_state: dict[str, dict[int, np.ndarray]]) -> None:
        """Keep a verify pass's row states ({row: state} per name) until keep()."""
        self._held = (self.length, new_state)

    def keep(self, path: np.ndarray) -> None:
        """Commit rows `path` of the held pass: the state after its last row."""
        if self._held is None or self._held[0] != self.length:
            raise ValueError("keep() needs the held states of a verify pass with nothing after it")
        _, held = self._held
        self._held = None
        self.commit(held, path)

    def rewind(self, length: int) -> int:
        """Restore the latest checkpoint at or before `length` (the zero state at 0) and return its
        length; the caller feeds the tokens from there to `length` again."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot rewind to {length}: the state follows {self.length} tokens")
        self._held = None
        if length == self.length or not self.shapes:  # nothing to restore: a model without recurrent layers
            self.length = length
            return length
        at = max((n for n in self.checkpoints if n <= length), default=0)
        self.checkpoints = {n: s for n, s in self.checkpoints.items() if n <= at}
        self.values = ({n: s.copy() for n, s in self.checkpoints[at].items()} if at
                       else {name: np.zeros(shape, np.float32) for name, shape in self.shapes.items()})
        self.length = at
        return at

    def copy_values(self) -> dict[str, np.ndarray]:
        """A copy of the current states (a snapshot's)."""
        return {name: s.copy() for name, s in self.values.items()}

    def restore(self, values: dict[str, np.ndarray], length: int) -> None:
        """Set the states to `values` (the state after `length` tokens), bit for bit."""
        if set(values) != set(self.shapes) or any(values[n].shape != s for n, s in self.shapes.items()):
            raise ValueError("the snapshot's recurrent states are not this model's")
        self.values = {name: np.array(values[name], np.float32) for name in self.shapes}
        self.length, self.checkpoints, self._held = length, {}, None

    def _checkpoint(self, length: int, states: dict[str, np.ndarray]) -> None:
        self.checkpoints[length] = {n: s.copy() for n, s in states.items()}
        for old in sorted(self.checkpoints)[:-MAX_CHECKPOINTS]:
            del self.checkpoints[old]
