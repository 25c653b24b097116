"""The op group of mixture of experts (docs/moe.md): moe_gate, moe_select, moe_weights, moe_matmul and
moe_sum. Each row is routed on its own, never by the other rows of the pass.

Owns: their attribute dataclasses and shape inference (`infer_<op>`). Does not own: the table that
binds them to ops and references (kinetic/ir/ops.py, the import surface for every name here).
"""

from __future__ import annotations

from dataclasses import dataclass

from kinetic.ir.numerics import moe as moe_numerics
from kinetic.ir.op_groups.checks import activation, check, n_inputs
from kinetic.ir.types import TensorType, f32, i32


@dataclass(frozen=True)
class MoeGateAttrs:
    gating: str  # "softmax" or "sigmoid" (numerics.moe.GATINGS)


@dataclass(frozen=True)
class MoeSelectAttrs:
    n_used: int  # experts per row


@dataclass(frozen=True)
class MoeWeightsAttrs:
    normalize: bool  # divide by the chosen weights' sum
    scale: float = 0.0  # then multiply by this (0 or 1: not at all)


@dataclass(frozen=True)
class MoeMatmulAttrs:
    activations: str = "q8"  # as MatmulAttrs
    order: str = ""  # the reduction order (kinetic/ir/orders.py); "" until the batch-invariance pass


def infer_moe_gate(ins, a: MoeGateAttrs) -> TensorType:
    n_inputs(ins, 1, "moe_gate")
    activation(ins[0], "moe_gate logits")
    check(a.gating in moe_numerics.GATINGS, f"moe_gate gating must be one of {moe_numerics.GATINGS}, got {a.gating!r}")
    return ins[0]


def infer_moe_select(ins, a: MoeSelectAttrs) -> TensorType:
    check(len(ins) in (1, 2), f"moe_select takes the probabilities and an optional bias, got {len(ins)} inputs")
    rows, n_expert = activation(ins[0], "moe_select probabilities")
    if len(ins) == 2:
        check(ins[1] == f32(n_expert), f"moe_select bias must be f32[{n_expert}], got {ins[1]}")
    check(0 < a.n_used <= n_expert, f"moe_select picks 1..{n_expert} experts, not {a.n_used}")
    return i32(rows, a.n_used)


def infer_moe_weights(ins, a: MoeWeightsAttrs) -> TensorType:
    n_inputs(ins, 2, "moe_weights")
    rows, _ = activation(ins[0], "moe_weights probabilities")
    ids = ins[1]
    check(ids.dtype == "i32" and len(ids.shape) == 2 and ids.shape[0] == rows,
           f"moe_weights experts must be i32[{rows},k], got {ids}")
    return f32(rows, ids.shape[1])


def infer_moe_matmul(ins, a: MoeMatmulAttrs) -> TensorType:
    n_inputs(ins, 3, "moe_matmul")
    x, w, ids = ins
    rows, width = activation(x, "moe_matmul input")
    check(len(w.shape) == 3, f"moe_matmul weight must be stacked experts [E, n_out, K], got {w}")
    check(ids.dtype == "i32" and len(ids.shape) == 2 and ids.shape[0] == rows,
           f"moe_matmul experts must be i32[{rows},k], got {ids}")
    n_used, k = ids.shape[1], w.shape[2]
    check(width in (k, n_used * k), f"moe_matmul input must be {k} wide (shared by the {n_used} slots) or "
           f"{n_used} x {k} (one per slot), got {x}")
    check(a.activations in ("q8", "f32"), f"moe_matmul activations must be q8 or f32, got {a.activations!r}")
    return f32(rows, n_used * w.shape[1])


def infer_moe_sum(ins, a) -> TensorType:
    n_inputs(ins, 2, "moe_sum")
    rows, width = activation(ins[0], "moe_sum outputs")
    _, n_used = activation(ins[1], "moe_sum weights")
    check(ins[1].shape[0] == rows and isinstance(width, int) and width % n_used == 0,
           f"moe_sum needs {n_used} equal slots per row of {ins[0]}")
    return f32(rows, width // n_used)
