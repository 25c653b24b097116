"""The recurrent states of a CUDA pass: what the host stages for each row's starting state and what it
reads back after the pass.

Owns: `state_shapes` (the recurrent states a graph's device part reads: name -> (rows, width)),
`input_fields` (their places in a plan's staged inputs: the rows' parents, i32 [T], and per state the
committed state of each row's sequence, f32 [T, rows*width]), `stage` (per pass: each row's parent,
and for each row without a parent in the pass its sequence's committed state, KVView.recurrent) and
`read` (each state after the rows the runtime may keep, rows.state_rows, every row when None, for
PassResult.new_state). Does not own the kernels that walk the rows (recurrent.py), the plan's buffers
(plan.py: a device buffer `after` per state, f32 [T, rows*width], the state after each row) or
keeping states between passes (kinetic/runtime/recurrent.py).

Why the host stages and gathers: a sequence's committed state lives in the runtime (its
RecurrentState, which keep() and snapshots rewrite), as the CPU step reads it; a pass uploads the
state of each row that starts from it with the pass's other inputs (one copy, replayable in a CUDA
graph), and the states the runtime keeps come back with the outputs. A row with a parent in the pass
reads its parent's `after` on the device. The staged rows cost T x state size a pass, which suits
the short convolution's states (kernel - 1 rows of channels: lfm2's 2 x 256 floats a layer).
"""

from __future__ import annotations

import numpy as np

from kinetic.ir.graph import Graph
from kinetic.ir.ops import Op
from kinetic.ir.rows import KVView, PassRows

F32 = np.float32


def state_shapes(graph: Graph, skip: frozenset[int] = frozenset()) -> dict[str, tuple[int, int]]:
    """name -> (rows, width) of every recurrent state a node outside `skip` reads."""
    used = {i for n in graph.nodes if n.id not in skip for i in n.inputs}
    return {n.attrs.name: tuple(int(d) for d in n.type.shape) for n in graph.nodes
            if n.op is Op.RECURRENT_STATE and n.id in used}


def input_fields(shapes: dict[str, tuple[int, int]], n_rows: int) -> list[tuple[object, int]]:
    """The staged inputs of a pass of n_rows rows: the parents, then each state's committed rows."""
    if not shapes:
        return []
    return [("parents", 4 * n_rows)] + [(("rstate", name), 4 * n_rows * r * w) for name, (r, w) in shapes.items()]


def stage(plan, rows: PassRows, kv: KVView) -> None:
    """Each row's parent, and each parentless row's committed state of its sequence, into the plan's
    staging (rows with a parent leave their committed rows as they were: the kernels do not read them)."""
    shapes = plan.model.recurrent
    if not shapes:
        return
    parents = np.asarray(rows.parents, np.int32)
    if np.any(parents >= np.arange(len(parents))):
        raise ValueError("a pass lists each row after its parent")
    plan.staged("parents", np.int32)[:] = parents
    roots = np.flatnonzero(parents < 0)
    for name, (r, w) in shapes.items():
        committed = plan.staged(("rstate", name), F32).reshape(plan.n_rows, r * w)
        for row in roots:
            committed[row] = np.asarray(kv.recurrent(int(rows.seqs[row]), name), F32).reshape(-1)


def read(plan, rows: PassRows) -> dict[str, dict[int, np.ndarray]]:
    """Each state after the rows the runtime may keep: {name: {row: f32 [rows, width]}}."""
    kept = range(len(rows.tokens)) if rows.state_rows is None else [int(r) for r in rows.state_rows]
    out: dict[str, dict[int, np.ndarray]] = {}
    for name, (r, w) in plan.model.recurrent.items():
        after = plan.model.backend.read(plan.state_after[name], F32, plan.n_rows * r * w).reshape(plan.n_rows, r, w)
        out[name] = {k: after[k].copy() for k in kept}
    return out
