"""What Qwen3.5's ops compute: the gated delta rule (a recurrent op), per-head column picks and the
sigmoid its gates use; one reference function per op (docs/recurrent.md).

Owns the meaning of `delta_rule` (Gated DeltaNet's state update and read-out, each row continuing
its parent row's state along its path, kinetic/ir/recurrence.py's scan_rows), `head_columns`
(each head's slice of an interleaved projection: Qwen3.5's query and gate halves) and `sigmoid`
(ggml_sigmoid). The arithmetic of one row is kinetic/ir/numerics/recurrent.py's. Does not own
keeping states between passes (kinetic/runtime/recurrent.py). This module imports nothing from
ops.py (ops.py imports it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from kinetic.ir.numerics import recurrent as rnum
from kinetic.ir.recurrence import scan_rows

if TYPE_CHECKING:
    from kinetic.ir.graph import Node
    from kinetic.ir.reference import Evaluation

F32 = np.float32
# (state f32 [n_head, S, S], q, k, v f32 [n_head, S], decay, beta f32 [n_head]) -> (out, new state)
RowStep = Callable[..., tuple[np.ndarray, np.ndarray]]


def delta_rule(ev: Evaluation, node: Node, x: list, row: RowStep | None = None) -> np.ndarray:
    """Gated DeltaNet's recurrence (numerics.delta_rule_row) of each row along its path: q and k f32
    [T, n_k_head*S] (L2-normed), v f32 [T, n_v_head*S], alpha f32 [T, n_v_head] (the decay's
    projection plus its bias), beta f32 [T, n_v_head] (before the sigmoid), A (a weight, one value
    per value head), the state rs[n_v_head*S, S]. Value head h reads key head h % n_k_head (ggml's
    broadcast). Per head: gate = softplus(alpha) * A, write strength sigmoid(beta), each an f32
    rounding as ggml's separate ops, and the decay expf(gate) with the C library's expf. `row` computes
    one row (the compiled step passes its kernel, which computes the same bits). Returns f32
    [T, n_v_head*S]."""
    q, k, v, alpha, beta, a_node, handle = x
    a, row = node.attrs, row or rnum.delta_rule_row
    decay = ev.runner.weight(a_node).values.reshape(-1).astype(F32)
    key_head = np.arange(a.n_v_head) % a.n_k_head
    gates = (rnum.softplus(alpha) * decay).astype(F32)  # f32 [T, n_v_head]
    decays, strengths = rnum.libm_f32("expf", gates), rnum.sigmoid(beta)

    def step(state: np.ndarray, r: int):
        qs, ks = (t[r].reshape(a.n_k_head, a.head_dim)[key_head] for t in (q, k))
        out, new = row(state.reshape(a.n_v_head, a.head_dim, a.head_dim), qs, ks,
                       v[r].reshape(a.n_v_head, a.head_dim), decays[r], strengths[r])
        return out.reshape(-1), new.reshape(state.shape)

    return scan_rows(ev, handle.name, a.n_v_head * a.head_dim, step)


def head_columns(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """Per head h of x f32 [T, n_head*stride], its columns h*stride + start .. + count - 1, the heads
    side by side: f32 [T, n_head*count], bits as they are."""
    a = node.attrs
    heads = x[0].reshape(x[0].shape[0], a.n_head, a.stride)
    return np.ascontiguousarray(heads[:, :, a.start:a.start + a.count]).reshape(x[0].shape[0], -1)


def sigmoid(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """ggml_sigmoid: 1 / (1 + expf(-x)) per value (the C library's expf)."""
    return rnum.sigmoid(x[0])
