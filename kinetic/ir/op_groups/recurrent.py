"""The op group of recurrent layers: recurrent_state (the per-sequence state leaf), short_conv,
ssm_scan, delta_rule and head_columns (docs/recurrent.md). Each row continues the state its parent
row (or the committed state) left.

Owns: their attribute dataclasses and shape inference (`infer_<op>`). Does not own: the table that
binds them to ops and references (kinetic/ir/ops.py, the import surface for every name here).
"""

from __future__ import annotations

from dataclasses import dataclass

from kinetic.ir.op_groups.checks import activation, check, n_inputs
from kinetic.ir.types import TensorType, f32


@dataclass(frozen=True)
class RecurrentStateAttrs:
    name: str  # e.g. "conv.0": the key of the sequence's state the runtime keeps (one per name)
    layer: int


@dataclass(frozen=True)
class SsmScanAttrs:
    n_head: int
    head_dim: int
    n_group: int  # B and C groups; head h reads group h // (n_head / n_group)
    d_state: int


@dataclass(frozen=True)
class DeltaRuleAttrs:
    n_k_head: int  # q and k heads; value head h reads key head h % n_k_head
    n_v_head: int
    head_dim: int  # S: keys and values alike; the state is S x S per value head


@dataclass(frozen=True)
class HeadColumnsAttrs:
    n_head: int
    stride: int  # each head's width in the input
    start: int  # the first column taken within a head
    count: int  # how many per head


def infer_head_columns(ins, a: HeadColumnsAttrs) -> TensorType:
    n_inputs(ins, 1, "head_columns")
    rows, width = activation(ins[0], "head_columns input")
    check(width == a.n_head * a.stride and a.start >= 0 and a.count > 0 and a.start + a.count <= a.stride,
           f"head_columns {a.start}..{a.start + a.count - 1} of {a.n_head} heads of {a.stride} do not fit {ins[0]}")
    return f32(rows, a.n_head * a.count)


def infer_delta_rule(ins, a: DeltaRuleAttrs) -> TensorType:
    n_inputs(ins, 7, "delta_rule")
    q, k, v, alpha, beta, decay, state = ins
    rows, _ = activation(q, "delta_rule q")
    check(a.n_v_head % a.n_k_head == 0, f"delta_rule value heads {a.n_v_head} must be a multiple of {a.n_k_head}")
    for t, name, heads in ((q, "q", a.n_k_head), (k, "k", a.n_k_head), (v, "v", a.n_v_head)):
        width = heads * a.head_dim
        check(t == f32(rows, width), f"delta_rule {name} must be f32[{rows},{width}], got {t}")
    for t, name in ((alpha, "alpha"), (beta, "beta")):
        check(t == f32(rows, a.n_v_head), f"delta_rule {name} must be f32[{rows},{a.n_v_head}], got {t}")
    check(decay.dtype == "f32" and decay.shape in ((a.n_v_head, 1), (a.n_v_head,)),
           f"delta_rule A must be f32[{a.n_v_head}], got {decay}")
    check(state.dtype == "rs" and state.shape == (a.n_v_head * a.head_dim, a.head_dim),
           f"delta_rule state must be rs[{a.n_v_head * a.head_dim},{a.head_dim}], got {state}")
    return v


def infer_short_conv(ins, a) -> TensorType:
    n_inputs(ins, 3, "short_conv")
    x, w, state = ins
    rows, width = activation(x, "short_conv input")
    check(len(w.shape) == 2 and w.dtype == "f32" and w.shape[0] == width and w.shape[1] >= 2,
           f"short_conv weight must be f32[{width}, kernel >= 2], got {w}")
    check(state.dtype == "rs" and state.shape == (w.shape[1] - 1, width),
           f"short_conv state must be rs[{w.shape[1] - 1},{width}] (kernel - 1 past rows), got {state}")
    return x


def infer_ssm_scan(ins, a: SsmScanAttrs) -> TensorType:
    n_inputs(ins, 7, "ssm_scan")
    x, dt, decay, b, c, skip, state = ins
    rows, width = activation(x, "ssm_scan x")
    check(width == a.n_head * a.head_dim and a.n_head % a.n_group == 0,
           f"ssm_scan x must be {a.n_head} heads x {a.head_dim} over groups dividing them, got {x} "
           f"({a.n_group} groups)")
    check(dt == f32(rows, a.n_head), f"ssm_scan dt must be f32[{rows},{a.n_head}], got {dt}")
    groups = a.n_group * a.d_state
    for t, name in ((b, "B"), (c, "C")):
        check(t == f32(rows, groups), f"ssm_scan {name} must be f32[{rows},{groups}], got {t}")
    for t, name in ((decay, "A"), (skip, "D")):
        check(t.dtype == "f32" and t.shape in ((a.n_head, 1), (a.n_head,)),
               f"ssm_scan {name} must be f32[{a.n_head},1], got {t}")
    check(state.dtype == "rs" and state.shape == (width, a.d_state),
           f"ssm_scan state must be rs[{width},{a.d_state}], got {state}")
    return x
