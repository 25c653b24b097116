"""The compiled step's rows for recurrent ops: the short convolution (lfm2, Mamba-2's conv) and
Mamba-2's selective scan.

Owns: lowering `short_conv` to a Python instruction of the tape (between compiled segments; no
generated kernel yet), which computes every row of the pass at once: each row's window of the
kernel's taps is gathered along its own path (its ancestors in the pass, then its sequence's
committed state, PassTables-free: from the row table and KVView.recurrent), the taps are summed
as the reference's numerics say (numerics.short_conv_row's order, vectorized over rows), and each
row's state after it (its window's last kernel-1 rows) goes to the step's `new_state` for the
runtime. Rows never share a sum, so a batch gives each row what it gets alone; the result is the
reference's bit for bit (tests/runtime/test_recurrent_state.py). `ssm_scan` is a Python
instruction too, which runs the op's reference (kinetic/ir/reference.py: each row's scan along its
path) on the arena's rows. Does not own the state's keeping (kinetic/runtime/recurrent.py) nor the
arithmetic (kinetic/ir/numerics/recurrent.py).
"""

from __future__ import annotations

import numpy as np

from kinetic.ir import numerics
from kinetic.ir import reference as ref
from kinetic.ir.graph import Node
from kinetic.ir.ops import Op
from kinetic.ir.rows import KVView, PassRows


def short_conv(b, node: Node, ins: list[Node]) -> None:
    """The tape's row for short_conv(x, kernel, state): one Python instruction."""
    x, weight, state = ins
    width = x.type.shape[1]
    kernel = b.reference.weight(weight).values.reshape(width, -1).astype(np.float32)

    def run(step, n: int, n_out: int) -> None:
        window = gather_windows(step.pass_rows, step.pass_caches, state.attrs.name, step.view(x.id, n), kernel.shape[1])
        step.view(node.id, n)[:] = numerics.short_conv_row(window.transpose(1, 0, 2).reshape(kernel.shape[1], -1),
                                                           np.tile(kernel, (n, 1))).reshape(n, width)
        kept = range(n) if step.pass_rows.state_rows is None else step.pass_rows.state_rows
        step.new_state[state.attrs.name] = {int(r): window[r, 1:, :].copy() for r in kept}

    b.add_python(run, reads=(("v", x.id),), writes=(("v", node.id),))


def ssm_scan(b, node: Node, ins: list[Node]) -> None:
    """The tape's row for ssm_scan: one Python instruction running the reference on the arena's rows
    (weights through the step's reference interpreter, decoded once)."""
    computed = [i for i in ins if i.op not in (Op.PARAM, Op.RECURRENT_STATE)]

    def run(step, n: int, n_out: int) -> None:
        ev = ref.Evaluation(step.reference, step.pass_rows, step.pass_caches, new_state=step.new_state)
        inputs = [step.view(i.id, n) if i in computed else (i.attrs if i.op is Op.RECURRENT_STATE else i) for i in ins]
        step.view(node.id, n)[:] = ref.ssm_scan(ev, node, inputs)

    b.add_python(run, reads=tuple(("v", i.id) for i in computed), writes=(("v", node.id),))


def gather_windows(rows: PassRows, caches: KVView, name: str, values: np.ndarray, taps: int) -> np.ndarray:
    """f32 [T, taps, C]: each row's last `taps` values along its path, the oldest first: its own row
    last, then its ancestors' in the pass, then the newest rows of its sequence's committed state."""
    n = len(rows.tokens)
    seqs = [int(s) for s in np.unique(rows.seqs)]
    states = [caches.recurrent(s, name) for s in seqs]  # f32 [taps - 1, C] each, oldest first
    first_state = {s: n + i * (taps - 1) for i, s in enumerate(seqs)}  # index of its oldest row in `sources`
    sources = np.concatenate([values, *states]) if states else values
    index = np.empty((n, taps), np.int64)
    for r in range(n):
        cur, back_in_state = r, 0
        for tap in range(taps - 1, -1, -1):
            if cur >= 0:
                index[r, tap], cur = cur, int(rows.parents[cur])
            else:
                back_in_state += 1
                index[r, tap] = first_state[int(rows.seqs[r])] + (taps - 1) - back_in_state
    return sources[index]
