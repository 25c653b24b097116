"""The op table: one enum of ops and one spec record per op (`OPS`), which everything else reads.

An op's `OpSpec` holds all the IR knows about it: its attribute dataclass (one small frozen dataclass
per op), `infer` (its output type from its input types and attributes, raising VerifyError when they
do not fit; None for leaves that carry their type), its groups (`ELEMENTWISE`, `REDUCE`, `LEAF`) and
`reference`, the function that defines what it computes (kinetic/ir/reference.py), and, for a
reduction, `order`: the named per-row order of summation its reference follows on these inputs
(kinetic/ir/orders.py; ggml's order, and `mode_order` gives each numerics mode's). A reducing op's
attributes end with `order`, empty until the batch-invariance pass writes it
(kinetic/passes/batch_invariance.py); a non-empty one must be one of `allowed_orders`. The verifier
(graph.py), the text form (text.py) and the reference interpreter read this table; an op without a
spec raises. Adding an op is one enum member, its attributes and inference in its group's module
(kinetic/ir/op_groups/: lookups, attention, recurrent, moe, elementwise), one `OpSpec` row here
with its reference, and one row in each device's kernel table.

This module is the import surface: every attribute dataclass, `VerifyError` and `QUANTIZED_ROWS`
are imported from here, wherever their group module defines them.

Row semantics: activations are `f32[T, width]`, one row per token of the pass. Attention reads
which KV-cache entries each row may see from the pass's row table (sequence, position, parent),
which the runtime supplies; the graph only names the cache through a `state` node. A recurrent
layer names its per-sequence state through a `recurrent_state` node (`rs[rows,width]`): each row
continues the state its parent row left (docs/recurrent.md).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, fields

from kinetic.ir import delta_reference as delta_ref
from kinetic.ir import moe_reference as moe_ref
from kinetic.ir import orders
from kinetic.ir import reference as ref
from kinetic.ir.op_groups import attention, elementwise, lookups, moe, recurrent
from kinetic.ir.op_groups.attention import AttentionAttrs, LayerNormAttrs, RmsNormAttrs, RopeAttrs, StateAttrs
from kinetic.ir.op_groups.checks import VerifyError, check
from kinetic.ir.op_groups.elementwise import ScaleAttrs, SoftcapAttrs
from kinetic.ir.op_groups.lookups import (
    QUANTIZED_ROWS,
    ColumnsAttrs,
    EmbedAttrs,
    InputAttrs,
    MatmulAttrs,
    NoAttrs,
    ParamAttrs,
    QuantizeAttrs,
)
from kinetic.ir.op_groups.moe import MoeGateAttrs, MoeMatmulAttrs, MoeSelectAttrs, MoeWeightsAttrs
from kinetic.ir.op_groups.recurrent import DeltaRuleAttrs, HeadColumnsAttrs, RecurrentStateAttrs, SsmScanAttrs
from kinetic.ir.types import TensorType

__all__ = [
    "OPS", "ELEMENTWISE", "LEAVES", "REDUCE", "QUANTIZED_ROWS", "Group", "Op", "OpSpec", "VerifyError",
    "allowed_orders", "attr_fields", "check_attrs", "infer_type", "is_ggml_order", "mode_order", "reduction_order",
    "spec_of",
    "AttentionAttrs", "ColumnsAttrs", "DeltaRuleAttrs", "EmbedAttrs", "HeadColumnsAttrs", "InputAttrs",
    "LayerNormAttrs", "MatmulAttrs", "MoeGateAttrs", "MoeMatmulAttrs", "MoeSelectAttrs", "MoeWeightsAttrs",
    "NoAttrs", "ParamAttrs", "QuantizeAttrs", "RecurrentStateAttrs", "RmsNormAttrs", "RopeAttrs", "ScaleAttrs",
    "SoftcapAttrs", "SsmScanAttrs", "StateAttrs",
]


class Op(enum.Enum):
    # leaves
    INPUT = "input"  # per-pass data from the runtime: token ids, positions, output rows
    PARAM = "param"  # a weight, naming its GGUF tensor and keeping its stored type
    STATE = "state"  # runtime-owned state (KV cache) handle
    RECURRENT_STATE = "recurrent_state"  # runtime-owned per-sequence recurrent state (docs/recurrent.md)
    # lookups and projections
    EMBED = "embed"  # rows of a (possibly quantized) table
    MATMUL = "matmul"  # x @ w.T with w stored [n_out, n_in]
    TAKE_ROWS = "take_rows"  # select rows of x by index
    COLUMNS = "columns"  # a range of each row's values, x[:, start:start+count] (gemma4's per-layer inputs)
    CONCAT = "concat"  # each row's values of a, then of b (a prediction block's [enorm(embed); hnorm(hidden)])
    # normalization and position
    RMS_NORM = "rms_norm"
    LAYER_NORM = "layer_norm"  # (x - mean) / sqrt(variance + eps), times an optional weight (BERT's LLM_NORM)
    ROPE = "rope"
    # attention over the KV cache
    ATTENTION = "attention"
    # recurrent layers: each row continues the state its parent row (or the committed state) left
    SHORT_CONV = "short_conv"  # causal depthwise convolution over a rolling cache of past rows (lfm2)
    SSM_SCAN = "ssm_scan"  # Mamba-2's selective scan, plus x * D (granitehybrid, falcon-h1)
    DELTA_RULE = "delta_rule"  # Gated DeltaNet's state update and read-out (qwen35; delta_reference.py)
    HEAD_COLUMNS = "head_columns"  # each head's slice of an interleaved projection (qwen35's query and gate)
    # mixture of experts (docs/moe.md): each row routed on its own, never by the other rows of the pass
    MOE_GATE = "moe_gate"  # the router's probabilities from its logits (softmax or sigmoid)
    MOE_SELECT = "moe_select"  # each row's top-k experts (i32[T,k]), on the probabilities plus a bias
    MOE_WEIGHTS = "moe_weights"  # the chosen experts' weights (f32[T,k]), renormalized and scaled
    MOE_MATMUL = "moe_matmul"  # each row's slots through their experts' matrices of a stacked [E,N,K] weight
    MOE_SUM = "moe_sum"  # the slots' outputs times their weights, added slot by slot
    # elementwise
    ADD = "add"
    ADD_BIAS = "add_bias"  # a bias vector added to every row (ggml_add of a [n] tensor after a projection)
    MUL = "mul"
    SCALE = "scale"
    SILU = "silu"
    SIGMOID = "sigmoid"  # 1 / (1 + expf(-x)) (qwen35's gates)
    GELU = "gelu"
    SOFTCAP = "softcap"  # final-logit soft-capping (Gemma 4's final_logit_softcapping)
    # fused forms produced by passes
    SWIGLU = "swiglu"  # silu(gate) * up
    GEGLU = "geglu"  # gelu(gate) * up
    # device forms: made by the device phase, only for a device that declares them
    # (kinetic/passes/device_fusion.py; docs/ir.md, "The device phase")
    ADD_RMS_NORM = "add_rms_norm"  # rms_norm of an add, computed in the add's launch
    ROPE_PAIR = "rope_pair"  # rope, launched together with another rotation of the same positions
    QUANTIZE = "quantize"  # rows in a matmul's 8-bit format, once for every matmul that reads them


class Group(enum.Enum):
    LEAF = "leaf"  # bound by the runtime, not computed; no inputs
    ELEMENTWISE = "elementwise"  # each output value from the values at its own position
    REDUCE = "reduce"  # sums over a dimension: its spec names the order (`OpSpec.order`), its attributes carry it


# ---- the table ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpSpec:
    """Everything the IR knows about one op (see the module docstring)."""

    attrs: type  # the attribute dataclass
    infer: Callable[[list[TensorType], object], TensorType] | None  # None: the node carries its type
    reference: Callable  # reference(ev, node, inputs) -> value: what the op computes
    groups: frozenset[Group] = frozenset()
    # REDUCE ops: order(input_types, attrs) -> the name in orders.ORDERS its reference follows
    order: Callable[[list[TensorType], object], str] | None = None


def _spec(attrs: type, infer, reference: Callable, *groups: Group, order: Callable | None = None) -> OpSpec:
    """One row of the table: attribute dataclass, shape inference, reference, then the groups (and a
    reduction's order)."""
    return OpSpec(attrs, infer, reference, frozenset(groups), order)


OPS: dict[Op, OpSpec] = {
    Op.INPUT: _spec(InputAttrs, lookups.infer_input, ref.input_, Group.LEAF),
    Op.PARAM: _spec(ParamAttrs, None, ref.param, Group.LEAF),
    Op.STATE: _spec(StateAttrs, None, ref.state, Group.LEAF),
    Op.RECURRENT_STATE: _spec(RecurrentStateAttrs, None, ref.recurrent_state, Group.LEAF),
    Op.EMBED: _spec(EmbedAttrs, lookups.infer_embed, ref.embed),
    Op.MATMUL: _spec(MatmulAttrs, lookups.infer_matmul, ref.matmul, Group.REDUCE, order=orders.matmul_order),
    Op.TAKE_ROWS: _spec(NoAttrs, lookups.infer_take_rows, ref.take_rows),
    Op.COLUMNS: _spec(ColumnsAttrs, lookups.infer_columns, ref.columns),
    Op.CONCAT: _spec(NoAttrs, lookups.infer_concat, ref.concat),
    Op.RMS_NORM: _spec(RmsNormAttrs, attention.infer_rms_norm, ref.rms_norm, Group.REDUCE, order=orders.rms_norm_order),
    Op.LAYER_NORM: _spec(LayerNormAttrs, attention.infer_layer_norm, ref.layer_norm, Group.REDUCE,
                         order=orders.layer_norm_order),
    Op.ROPE: _spec(RopeAttrs, attention.infer_rope, ref.rope),
    Op.ATTENTION: _spec(AttentionAttrs, attention.infer_attention, ref.attention, Group.REDUCE,
                        order=orders.attention_order),
    Op.SHORT_CONV: _spec(NoAttrs, recurrent.infer_short_conv, ref.short_conv),
    Op.SSM_SCAN: _spec(SsmScanAttrs, recurrent.infer_ssm_scan, ref.ssm_scan),
    Op.DELTA_RULE: _spec(DeltaRuleAttrs, recurrent.infer_delta_rule, delta_ref.delta_rule),
    Op.HEAD_COLUMNS: _spec(HeadColumnsAttrs, recurrent.infer_head_columns, delta_ref.head_columns),
    Op.MOE_GATE: _spec(MoeGateAttrs, moe.infer_moe_gate, moe_ref.moe_gate),
    Op.MOE_SELECT: _spec(MoeSelectAttrs, moe.infer_moe_select, moe_ref.moe_select),
    Op.MOE_WEIGHTS: _spec(MoeWeightsAttrs, moe.infer_moe_weights, moe_ref.moe_weights),
    Op.MOE_MATMUL: _spec(MoeMatmulAttrs, moe.infer_moe_matmul, moe_ref.moe_matmul, Group.REDUCE,
                         order=orders.matmul_order),
    Op.MOE_SUM: _spec(NoAttrs, moe.infer_moe_sum, moe_ref.moe_sum),
    Op.ADD: _spec(NoAttrs, elementwise.binary(Op.ADD.value), ref.add, Group.ELEMENTWISE),
    # add_bias is a broadcast: not ELEMENTWISE's same-position rule
    Op.ADD_BIAS: _spec(NoAttrs, elementwise.infer_add_bias, ref.add_bias),
    Op.MUL: _spec(NoAttrs, elementwise.binary(Op.MUL.value), ref.mul, Group.ELEMENTWISE),
    Op.SCALE: _spec(ScaleAttrs, elementwise.unary(Op.SCALE.value), ref.scale, Group.ELEMENTWISE),
    Op.SILU: _spec(NoAttrs, elementwise.unary(Op.SILU.value), ref.silu, Group.ELEMENTWISE),
    Op.SIGMOID: _spec(NoAttrs, elementwise.unary(Op.SIGMOID.value), delta_ref.sigmoid, Group.ELEMENTWISE),
    Op.GELU: _spec(NoAttrs, elementwise.unary(Op.GELU.value), ref.gelu, Group.ELEMENTWISE),
    Op.SOFTCAP: _spec(SoftcapAttrs, elementwise.unary(Op.SOFTCAP.value), ref.softcap, Group.ELEMENTWISE),
    Op.SWIGLU: _spec(NoAttrs, elementwise.binary(Op.SWIGLU.value), ref.swiglu, Group.ELEMENTWISE),
    Op.GEGLU: _spec(NoAttrs, elementwise.binary(Op.GEGLU.value), ref.geglu, Group.ELEMENTWISE),
    Op.ADD_RMS_NORM: _spec(RmsNormAttrs, attention.infer_add_rms_norm, ref.add_rms_norm, Group.REDUCE,
                           order=orders.rms_norm_order),
    Op.ROPE_PAIR: _spec(RopeAttrs, attention.infer_rope_pair, ref.rope_pair),
    Op.QUANTIZE: _spec(QuantizeAttrs, lookups.infer_quantize, ref.quantize),
}

LEAVES = frozenset(op for op, spec in OPS.items() if Group.LEAF in spec.groups)
ELEMENTWISE = frozenset(op for op, spec in OPS.items() if Group.ELEMENTWISE in spec.groups)
REDUCE = frozenset(op for op, spec in OPS.items() if Group.REDUCE in spec.groups)


def spec_of(op: Op) -> OpSpec:
    """The op's spec; raises VerifyError for an op without one."""
    spec = OPS.get(op)
    if spec is None:
        raise VerifyError(f"op {op.value} has no spec")
    return spec


def attr_fields(attrs) -> list[tuple[str, object]]:
    return [(f.name, getattr(attrs, f.name)) for f in fields(attrs)]


def check_attrs(op: Op, attrs) -> None:
    """Raise VerifyError unless `attrs` is an instance of the op's attribute dataclass."""
    cls = spec_of(op).attrs
    check(isinstance(attrs, cls), f"{op.value} needs {cls.__name__}, got {type(attrs).__name__}")


def infer_type(op: Op, input_types: list[TensorType], attrs) -> TensorType:
    """The output type of `op` on these inputs; raises VerifyError when they do not fit."""
    spec = spec_of(op)
    if spec.infer is None:
        raise VerifyError(f"{op.value} nodes carry their type; they are not inferred")
    check_attrs(op, attrs)
    result = spec.infer(input_types, attrs)
    if spec.order is not None and attrs.order:
        allowed = allowed_orders(op, input_types, attrs)
        check(attrs.order in allowed, f"{op.value} order {attrs.order!r} is not an order its reference "
               f"follows on these inputs ({', '.join(repr(o) for o in sorted(allowed))})")
    return result


def mode_order(op: Op, input_types: list[TensorType], attrs, numerics: str = orders.DEFAULT_NUMERICS) -> str:
    """The order a reduction of `op` takes in numerics mode `numerics` (orders.NUMERICS): the mode's
    entry in orders.FAST_ORDERS for "fast" where the op has one, else the spec's (ggml's) order."""
    spec = spec_of(op)
    if spec.order is None:
        raise VerifyError(f"{op.value} reduces but its spec names no order (kinetic/ir/orders.py)")
    if numerics not in orders.NUMERICS:
        raise VerifyError(f"unknown numerics mode {numerics!r} (one of {', '.join(orders.NUMERICS)})")
    fast = orders.FAST_ORDERS.get(op.value) if numerics == "fast" else None
    return (fast or spec.order)(input_types, attrs)


def allowed_orders(op: Op, input_types: list[TensorType], attrs) -> frozenset[str]:
    """The orders a node of `op` on these inputs may carry: its order in each numerics mode."""
    return frozenset(mode_order(op, input_types, attrs, mode) for mode in orders.NUMERICS)


def is_ggml_order(op: Op, input_types: list[TensorType], attrs) -> bool:
    """Whether the node sums in ggml's order (its spec's): what a device that follows only ggml's
    orders per weight type can run, whatever order names it declares."""
    order = reduction_order(op, input_types, attrs)
    return order is None or order == spec_of(op).order(input_types, attrs)


def reduction_order(op: Op, input_types: list[TensorType], attrs) -> str | None:
    """The order a node of `op` sums in: its `order` attribute, or, before the batch-invariance pass
    has written it (a graph built by hand), the one its spec gives; None for an op that does not reduce."""
    spec = spec_of(op)
    if spec.order is None:
        return None
    return attrs.order or spec.order(input_types, attrs)
