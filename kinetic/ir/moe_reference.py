"""What the mixture-of-experts ops compute: one reference function per op (docs/moe.md).

Owns the meaning of moe_gate, moe_select, moe_weights, moe_matmul and moe_sum on numpy values,
with ggml's numerics (kinetic/ir/numerics/moe.py for the router, numerics.matmul for each expert's
rows). Every one works row by row: a row's experts, weights and outputs never depend on which
experts the other rows of the pass chose, nor on how many rows there are. moe_matmul groups the
pass's rows by expert (one matmul per expert used) and asks the runner for each group's product
(`expert_matmul`), which is row by row too, so grouping changes no row's arithmetic. Does not own
the expert weights' cache (the runner's) nor where experts run (kinetic/codegen/common/flywheel.py).
This module imports nothing from ops.py (ops.py imports it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from kinetic.ir.numerics import moe as moe_numerics

if TYPE_CHECKING:
    from kinetic.ir.graph import Node
    from kinetic.ir.reference import Evaluation

F32 = np.float32


class ExpertRunner(Protocol):
    """What moe_matmul asks of the runner (kinetic/ir/interpreter.py's Interpreter has it)."""

    def weight(self, param: Node):
        """The weight of a `param` node, decoded once (the selection bias)."""

    def expert_matmul(self, x: np.ndarray, weight: Node, expert: int, attrs) -> np.ndarray:
        """x f32 [rows, K] times expert `expert`'s [n_out, K] of the stacked weight, transposed."""


def moe_gate(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """The router's probabilities f32 [T, n_expert] from its logits (ggml_soft_max or ggml_sigmoid)."""
    return moe_numerics.gate(x[0], node.attrs.gating)


def moe_select(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """i32 [T, k]: each row's k experts of highest probability (plus the file's selection bias, one
    f32 add, when given), highest first."""
    scores = x[0]
    if len(x) == 2:
        scores = (scores + ev.runner.weight(x[1]).values.reshape(-1)).astype(F32)
    return moe_numerics.top_k(scores, node.attrs.n_used)


def moe_weights(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """f32 [T, k]: the unbiased probabilities of the chosen experts, renormalized and scaled."""
    a = node.attrs
    return moe_numerics.route_weights(x[0], x[1], normalize=a.normalize, scale=a.scale)


def slot_inputs(x: np.ndarray, n_used: int, k: int) -> np.ndarray:
    """f32 [T, n_used, K]: each slot's input row (x shared by every slot when it is K wide)."""
    if x.shape[1] == k:
        return np.broadcast_to(x[:, None, :], (x.shape[0], n_used, k))
    return x.reshape(x.shape[0], n_used, k)


def moe_matmul(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """f32 [T, k * N]: slot s of row r is its input times expert ids[r, s]'s [N, K] matrix, computed
    in one product per expert over the (row, slot) pairs that chose it."""
    inputs, weight, ids = x
    n_expert, n_out, k = weight.type.shape
    rows, n_used = ids.shape
    per_slot = slot_inputs(inputs, n_used, k)
    out = np.empty((rows, n_used, n_out), F32)
    for expert in np.unique(ids):
        r, s = np.nonzero(ids == expert)
        out[r, s] = ev.runner.expert_matmul(np.ascontiguousarray(per_slot[r, s], F32), weight, int(expert),
                                            node.attrs)
    return out.reshape(rows, n_used * n_out)


def moe_sum(ev: Evaluation, node: Node, x: list) -> np.ndarray:
    """f32 [T, width]: slot outputs times their weights, slot 0 + slot 1 + ... (ggml_mul, ggml_add)."""
    return moe_numerics.weighted_sum(x[0], x[1])
