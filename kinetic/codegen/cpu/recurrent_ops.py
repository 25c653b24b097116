"""The compiled step's rows for recurrent ops: the short convolution (lfm2, Mamba-2's conv),
Mamba-2's selective scan, and Qwen3.5's delta rule with its row-local helpers (head_columns,
sigmoid).

Owns: lowering `short_conv` to a Python instruction of the tape (between compiled segments), which
computes every row of the pass at once: each row's window of the kernel's taps is gathered along its
own path (its ancestors in the pass, then its sequence's committed state, PassTables-free: from the
row table and KVView.recurrent), the taps are summed as the reference's numerics say
(numerics.short_conv_row's order, in a numba kernel), and each row's state after it (its window's
last kernel-1 rows) goes to the step's `new_state` for the runtime. Rows never share a sum, so a
batch gives each row what it gets alone; the result is the reference's bit for bit
(tests/runtime/test_recurrent_state.py). `ssm_scan` and `delta_rule` are Python instructions too,
which walk the rows as the ops' references do (kinetic/ir/reference.py, kinetic/ir/delta_reference.py:
each row's state along its path) with each row's arithmetic in a numba kernel
(recurrent_kernels.py). `head_columns` runs its reference row by row and `sigmoid` a numba loop
calling the C library's expf. Does not own the state's keeping (kinetic/runtime/recurrent.py) nor
the arithmetic (kinetic/ir/numerics/recurrent.py).
"""

from __future__ import annotations

import numpy as np

from kinetic.codegen.cpu import recurrent_kernels
from kinetic.ir import delta_reference as delta_ref
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
        step.view(node.id, n)[:] = recurrent_kernels.short_conv_rows(window, kernel)
        kept = range(n) if step.pass_rows.state_rows is None else step.pass_rows.state_rows
        step.new_state[state.attrs.name] = {int(r): window[r, 1:, :].copy() for r in kept}

    b.add_python(run, reads=(("v", x.id),), writes=(("v", node.id),))


def path_walking(reference, row):
    """The tape's row for an op whose reference walks the pass's rows, each from its state along its
    path (ssm_scan, delta_rule): one Python instruction running `reference` (weights through the
    step's reference interpreter, decoded once) with each row computed by the compiled kernel `row`
    (recurrent_kernels.py, the reference's bits)."""
    def lower(b, node: Node, ins: list[Node]) -> None:
        computed = [i for i in ins if i.op not in (Op.PARAM, Op.RECURRENT_STATE)]

        def run(step, n: int, n_out: int) -> None:
            ev = ref.Evaluation(step.reference, step.pass_rows, step.pass_caches, new_state=step.new_state)
            inputs = [step.view(i.id, n) if i in computed else (i.attrs if i.op is Op.RECURRENT_STATE else i)
                      for i in ins]
            step.view(node.id, n)[:] = reference(ev, node, inputs, row=row)

        b.add_python(run, reads=tuple(("v", i.id) for i in computed), writes=(("v", node.id),))

    return lower


def row_local(reference):
    """The tape's row for an op that computes each row from that row alone (head_columns, sigmoid):
    one Python instruction running its reference on the arena's rows."""
    def lower(b, node: Node, ins: list[Node]) -> None:
        def run(step, n: int, n_out: int) -> None:
            step.view(node.id, n)[:] = reference(None, node, [step.view(i.id, n) for i in ins])

        b.add_python(run, reads=tuple(("v", i.id) for i in ins), writes=(("v", node.id),))

    return lower


ssm_scan = path_walking(ref.ssm_scan, recurrent_kernels.ssm_scan_row)  # Mamba-2 (kinetic/ir/reference.py)
delta_rule = path_walking(delta_ref.delta_rule, recurrent_kernels.delta_rule_row)  # Gated DeltaNet
head_columns = row_local(delta_ref.head_columns)
sigmoid = row_local(lambda ev, node, x: recurrent_kernels.sigmoid(x[0]))


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
