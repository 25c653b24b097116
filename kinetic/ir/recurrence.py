"""Which state each row of a pass continues, for the references of recurrent ops.

Owns: `scan_rows`, the walk every recurrent op's reference shares: rows in pass order (a parent
before its children), each starting from the state its parent row left or, for a row without a
parent in the pass, from its sequence's committed state (KVView.recurrent), and recording the state
it leaves in the pass's `new_state` ({row: f32 [rows, width]} per state name, for the rows the
runtime may keep: rows.state_rows) for the runtime to commit (the last committed row's) or to hold
for keep() (a draft tree's). A row's output and state depend
only on its own path, so a batch gives each row what it gets alone and a tree row what its path
gives. Does not own the arithmetic of one row (kinetic/ir/numerics/recurrent.py) nor keeping states
between passes (kinetic/runtime/recurrent.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from kinetic.ir.reference import Evaluation

# step(state f32 [rows, width], row index) -> (the row's output f32 [n], the state it leaves)
Step = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]


def scan_rows(ev: Evaluation, name: str, width: int, step: Step) -> np.ndarray:
    """Run `step` over the pass's rows along their paths; returns the outputs f32 [T, width] and
    records in ev.new_state[name] the state after each row the runtime may keep (rows.state_rows,
    every row when None). A row's state is dropped once its last child has read it."""
    rows = ev.rows
    n = len(rows.tokens)
    out = np.empty((n, width), np.float32)
    kept = set(range(n)) if rows.state_rows is None else {int(r) for r in rows.state_rows}
    children = np.bincount(rows.parents[rows.parents >= 0], minlength=n) if n else np.zeros(0, np.int64)
    after: dict[int, np.ndarray] = {}
    recorded: dict[int, np.ndarray] = {}
    for r in range(n):
        parent = int(rows.parents[r])
        if parent >= r:
            raise ValueError(f"row {r}'s parent {parent} comes after it: a pass lists parents first")
        state = after[parent] if parent >= 0 else ev.kv.recurrent(int(rows.seqs[r]), name)
        out[r], new = step(state, r)
        if parent >= 0:
            children[parent] -= 1
            if children[parent] == 0:
                del after[parent]
        if children[r]:
            after[r] = new
        if r in kept:
            recorded[r] = new.astype(np.float32)
    ev.new_state[name] = recorded
    return out
