"""The op table: one enum of ops and one spec record per op (`OPS`), which everything else reads.

An op's `OpSpec` holds all the IR knows about it: its attribute dataclass (one small frozen dataclass
per op), `infer` (its output type from its input types and attributes, raising VerifyError when they
do not fit; None for leaves that carry their type), its groups (`ELEMENTWISE`, `REDUCE`, `LEAF`) and
`reference`, the function that defines what it computes (kinetic/ir/reference.py), and, for a
reduction, `order`: the named per-row order of summation its reference follows on these inputs
(kinetic/ir/orders.py). A reducing op's attributes end with `order`, empty until the batch-invariance
pass writes it (kinetic/passes/batch_invariance.py); a non-empty one must be the spec's. The verifier
(graph.py), the text form (text.py) and the reference interpreter read this table; an op without a
spec raises. Adding an op is one enum member, its attributes, one `OpSpec` row with its reference,
and one row in each device's kernel table.

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
from kinetic.ir.numerics import moe as moe_numerics
from kinetic.ir.numerics.rotary import Rotary
from kinetic.ir.quants import QUANT_TYPES
from kinetic.ir.types import R, T, TensorType, f32, i32


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


# ---- attributes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class NoAttrs:
    pass


@dataclass(frozen=True)
class InputAttrs:
    name: str  # "tokens", "positions", "token_types" (BERT's segment ids) or "output_rows"


@dataclass(frozen=True)
class ParamAttrs:
    tensor: str  # GGUF tensor name


@dataclass(frozen=True)
class StateAttrs:
    name: str  # e.g. "kv.3"
    layer: int
    n_kv_head: int
    head_dim: int


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


@dataclass(frozen=True)
class EmbedAttrs:
    pass


@dataclass(frozen=True)
class MatmulAttrs:
    # "q8": activations are quantized to 8 bits per block first, as ggml's vec-dot does for
    # quantized weights (Q8_0 for legacy types, Q8_1 for Q4_1/Q5_1, Q8_K for k-quants);
    # "f32": plain float activations.
    activations: str = "q8"
    order: str = ""  # the reduction order (kinetic/ir/orders.py); "" until the batch-invariance pass


@dataclass(frozen=True)
class RmsNormAttrs:
    eps: float
    group: int = 0  # normalize each consecutive group of this many values (per head); 0 = the whole row
    order: str = ""  # the reduction order (kinetic/ir/orders.py); "" until the batch-invariance pass


@dataclass(frozen=True)
class LayerNormAttrs:
    eps: float
    order: str = ""  # the reduction order (kinetic/ir/orders.py); "" until the batch-invariance pass


@dataclass(frozen=True)
class RopeAttrs:
    n_head: int
    head_dim: int
    n_rot: int  # leading values of each head that rotate
    theta: float  # frequency base
    neox: bool  # NeoX layout (halves) instead of interleaved pairs
    freq_scale: float = 1.0  # linear scaling: positions multiplied by this
    # YaRN (ext_factor 0 = off): original context, extrapolation mix, beta fast/slow; attn_factor is the
    # magnitude ggml_rope_ext multiplies cos and sin by (any scaling; YaRN multiplies its own too)
    yarn_orig_ctx: int = 0
    yarn_ext_factor: float = 0.0
    yarn_attn_factor: float = 1.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    # per pair, dividing its angle: the file's rope_freqs tensor (llama3 scaling, Gemma 4's proportional
    # rotary), n_rot/2 positive values; () = none. Values, not a tensor input: a device's cos/sin tables
    # are host tables keyed by them, and a stored graph carries them in its text
    freq_factors: tuple[float, ...] = ()

    @property
    def rotary(self) -> Rotary:
        """The parameters that fix this node's cos/sin table (a device keeps one table per value)."""
        return Rotary(self.n_rot, self.theta, self.freq_scale, self.yarn_ext_factor, self.yarn_attn_factor,
                      self.yarn_orig_ctx, self.yarn_beta_fast, self.yarn_beta_slow, tuple(self.freq_factors))


@dataclass(frozen=True)
class AttentionAttrs:
    n_head: int
    n_kv_head: int
    head_dim: int
    scale: float
    window: int = 0  # sliding window in positions (0 = none): a row at p sees positions > p - window
    softcap: float = 0.0  # logit soft-capping of the scores (0 = off)
    kv_dtype: str = "f16"  # how the cache stores keys and values
    order: str = ""  # the reduction order (kinetic/ir/orders.py); "" until the batch-invariance pass


@dataclass(frozen=True)
class ScaleAttrs:
    factor: float


@dataclass(frozen=True)
class QuantizeAttrs:
    format: str  # "q8_0", "q8_1" or "q8_k": the format of the weights' dots that read it (QUANT_TYPES)
    in_producer: bool = False  # its input's launch writes it too (no launch of its own)


@dataclass(frozen=True)
class ColumnsAttrs:
    start: int  # the first column taken
    count: int  # how many


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


@dataclass(frozen=True)
class SoftcapAttrs:
    cap: float  # cap * tanh(x / cap)


# ---- shape inference ----------------------------------------------------------------------------


class VerifyError(ValueError):
    """An op's inputs or attributes do not fit its spec."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise VerifyError(msg)


def _activation(t: TensorType, what: str) -> tuple:
    _check(t.dtype == "f32" and len(t.shape) == 2, f"{what} must be f32[rows, width], got {t}")
    return t.shape


def _n_inputs(ins: list[TensorType], n: int, op: Op) -> None:
    _check(len(ins) == n, f"{op.value} takes {n} inputs, got {len(ins)}")


def _infer_input(ins, a: InputAttrs) -> TensorType:
    _n_inputs(ins, 0, Op.INPUT)
    _check(a.name in ("tokens", "positions", "token_types", "output_rows"), f"unknown input {a.name!r}")
    return i32(R) if a.name == "output_rows" else i32(T)


def _infer_embed(ins, a) -> TensorType:
    _n_inputs(ins, 2, Op.EMBED)
    table, ids = ins
    _check(len(table.shape) == 2, f"embedding table must be 2-D, got {table}")
    _check(ids.dtype == "i32" and len(ids.shape) == 1, f"embedding ids must be i32[rows], got {ids}")
    return f32(ids.shape[0], table.shape[1])


def _infer_matmul(ins, a: MatmulAttrs) -> TensorType:
    _n_inputs(ins, 2, Op.MATMUL)
    x, w = ins
    _check(len(w.shape) == 2, f"matmul weight must be 2-D, got {w}")
    if x.dtype in QUANTIZED_ROWS:  # rows a quantize node made: in the format this weight's dots take
        fmt = QUANT_TYPES[w.ggml_type].activation if w.ggml_type in QUANT_TYPES else None
        _check(a.activations == "q8" and x.dtype == fmt, f"matmul of {w} reads {fmt} rows, got {x}")
        rows, k = x.shape
    else:
        rows, k = _activation(x, "matmul input")
    _check(w.shape[1] == k, f"matmul width mismatch: input {x}, weight {w}")
    _check(a.activations in ("q8", "f32"), f"matmul activations must be q8 or f32, got {a.activations!r}")
    return f32(rows, w.shape[0])


def _infer_take_rows(ins, a) -> TensorType:
    _n_inputs(ins, 2, Op.TAKE_ROWS)
    x, idx = ins
    _, width = _activation(x, "take_rows input")
    _check(idx.dtype == "i32" and len(idx.shape) == 1, f"take_rows index must be i32[rows], got {idx}")
    return f32(idx.shape[0], width)


def _infer_columns(ins, a: ColumnsAttrs) -> TensorType:
    _n_inputs(ins, 1, Op.COLUMNS)
    rows, width = _activation(ins[0], "columns input")
    _check(a.start >= 0 and a.count > 0 and a.start + a.count <= width,
           f"columns {a.start}..{a.start + a.count - 1} are not within the {width} of {ins[0]}")
    return f32(rows, a.count)


def _infer_head_columns(ins, a: HeadColumnsAttrs) -> TensorType:
    _n_inputs(ins, 1, Op.HEAD_COLUMNS)
    rows, width = _activation(ins[0], "head_columns input")
    _check(width == a.n_head * a.stride and a.start >= 0 and a.count > 0 and a.start + a.count <= a.stride,
           f"head_columns {a.start}..{a.start + a.count - 1} of {a.n_head} heads of {a.stride} do not fit {ins[0]}")
    return f32(rows, a.n_head * a.count)


def _infer_rms_norm(ins, a: RmsNormAttrs) -> TensorType:
    _check(len(ins) in (1, 2), f"rms_norm takes x and an optional weight, got {len(ins)} inputs")
    rows, width = _activation(ins[0], "rms_norm input")
    group = a.group or width
    _check(isinstance(width, int) and width % group == 0, f"rms_norm group {a.group} does not divide {width}")
    if len(ins) == 2:
        _check(ins[1].shape == (group,), f"rms_norm weight must be [{group}], got {ins[1]}")
    _check(a.eps > 0, "rms_norm eps must be positive")
    return ins[0]


def _infer_layer_norm(ins, a: LayerNormAttrs) -> TensorType:
    _check(len(ins) in (1, 2), f"layer_norm takes x and an optional weight, got {len(ins)} inputs")
    rows, width = _activation(ins[0], "layer_norm input")
    if len(ins) == 2:
        _check(ins[1].shape == (width,), f"layer_norm weight must be [{width}], got {ins[1]}")
    _check(a.eps >= 0, "layer_norm eps must not be negative")
    return ins[0]


def _infer_rope(ins, a: RopeAttrs) -> TensorType:
    _n_inputs(ins, 2, Op.ROPE)
    x, pos = ins
    rows, width = _activation(x, "rope input")
    _check(width == a.n_head * a.head_dim, f"rope width {width} != {a.n_head} heads x {a.head_dim}")
    _check(0 < a.n_rot <= a.head_dim and a.n_rot % 2 == 0, f"rope n_rot {a.n_rot} invalid")
    _check(pos.dtype == "i32" and pos.shape == (rows,), f"rope positions must be i32[{rows}], got {pos}")
    _check(not a.freq_factors or len(a.freq_factors) == a.n_rot // 2,
           f"rope needs {a.n_rot // 2} freq factors (one per rotated pair), got {len(a.freq_factors)}")
    _check(all(f > 0 for f in a.freq_factors), "rope freq factors must be positive")
    _check(a.freq_scale > 0 and (not a.yarn_ext_factor or a.yarn_orig_ctx > 0),
           "rope needs a positive freq_scale, and YaRN its original context")
    return x


def _infer_delta_rule(ins, a: DeltaRuleAttrs) -> TensorType:
    _n_inputs(ins, 7, Op.DELTA_RULE)
    q, k, v, alpha, beta, decay, state = ins
    rows, _ = _activation(q, "delta_rule q")
    _check(a.n_v_head % a.n_k_head == 0, f"delta_rule value heads {a.n_v_head} must be a multiple of {a.n_k_head}")
    for t, name, heads in ((q, "q", a.n_k_head), (k, "k", a.n_k_head), (v, "v", a.n_v_head)):
        width = heads * a.head_dim
        _check(t == f32(rows, width), f"delta_rule {name} must be f32[{rows},{width}], got {t}")
    for t, name in ((alpha, "alpha"), (beta, "beta")):
        _check(t == f32(rows, a.n_v_head), f"delta_rule {name} must be f32[{rows},{a.n_v_head}], got {t}")
    _check(decay.dtype == "f32" and decay.shape in ((a.n_v_head, 1), (a.n_v_head,)),
           f"delta_rule A must be f32[{a.n_v_head}], got {decay}")
    _check(state.dtype == "rs" and state.shape == (a.n_v_head * a.head_dim, a.head_dim),
           f"delta_rule state must be rs[{a.n_v_head * a.head_dim},{a.head_dim}], got {state}")
    return v


def _infer_attention(ins, a: AttentionAttrs) -> TensorType:
    _n_inputs(ins, 4, Op.ATTENTION)
    q, k, v, kv = ins
    rows, qw = _activation(q, "attention q")
    _check(qw == a.n_head * a.head_dim, f"attention q width {qw} != {a.n_head} x {a.head_dim}")
    for t, name in ((k, "k"), (v, "v")):
        r, w = _activation(t, f"attention {name}")
        _check(r == rows and w == a.n_kv_head * a.head_dim, f"attention {name} must be f32[{rows},"
               f"{a.n_kv_head * a.head_dim}], got {t}")
    _check(kv.dtype == "kv", f"attention state must be a kv handle, got {kv}")
    _check(a.n_head % a.n_kv_head == 0, "attention heads must be a multiple of kv heads")
    _check(a.kv_dtype in ("f16", "f32"), f"kv cache dtype must be f16 or f32, got {a.kv_dtype!r}")
    return q


def _infer_short_conv(ins, a) -> TensorType:
    _n_inputs(ins, 3, Op.SHORT_CONV)
    x, w, state = ins
    rows, width = _activation(x, "short_conv input")
    _check(len(w.shape) == 2 and w.dtype == "f32" and w.shape[0] == width and w.shape[1] >= 2,
           f"short_conv weight must be f32[{width}, kernel >= 2], got {w}")
    _check(state.dtype == "rs" and state.shape == (w.shape[1] - 1, width),
           f"short_conv state must be rs[{w.shape[1] - 1},{width}] (kernel - 1 past rows), got {state}")
    return x


def _infer_ssm_scan(ins, a: SsmScanAttrs) -> TensorType:
    _n_inputs(ins, 7, Op.SSM_SCAN)
    x, dt, decay, b, c, skip, state = ins
    rows, width = _activation(x, "ssm_scan x")
    _check(width == a.n_head * a.head_dim and a.n_head % a.n_group == 0,
           f"ssm_scan x must be {a.n_head} heads x {a.head_dim} over groups dividing them, got {x} "
           f"({a.n_group} groups)")
    _check(dt == f32(rows, a.n_head), f"ssm_scan dt must be f32[{rows},{a.n_head}], got {dt}")
    groups = a.n_group * a.d_state
    for t, name in ((b, "B"), (c, "C")):
        _check(t == f32(rows, groups), f"ssm_scan {name} must be f32[{rows},{groups}], got {t}")
    for t, name in ((decay, "A"), (skip, "D")):
        _check(t.dtype == "f32" and t.shape in ((a.n_head, 1), (a.n_head,)),
               f"ssm_scan {name} must be f32[{a.n_head},1], got {t}")
    _check(state.dtype == "rs" and state.shape == (width, a.d_state),
           f"ssm_scan state must be rs[{width},{a.d_state}], got {state}")
    return x


def _infer_moe_gate(ins, a: MoeGateAttrs) -> TensorType:
    _n_inputs(ins, 1, Op.MOE_GATE)
    _activation(ins[0], "moe_gate logits")
    _check(a.gating in moe_numerics.GATINGS, f"moe_gate gating must be one of {moe_numerics.GATINGS}, got {a.gating!r}")
    return ins[0]


def _infer_moe_select(ins, a: MoeSelectAttrs) -> TensorType:
    _check(len(ins) in (1, 2), f"moe_select takes the probabilities and an optional bias, got {len(ins)} inputs")
    rows, n_expert = _activation(ins[0], "moe_select probabilities")
    if len(ins) == 2:
        _check(ins[1] == f32(n_expert), f"moe_select bias must be f32[{n_expert}], got {ins[1]}")
    _check(0 < a.n_used <= n_expert, f"moe_select picks 1..{n_expert} experts, not {a.n_used}")
    return i32(rows, a.n_used)


def _infer_moe_weights(ins, a: MoeWeightsAttrs) -> TensorType:
    _n_inputs(ins, 2, Op.MOE_WEIGHTS)
    rows, _ = _activation(ins[0], "moe_weights probabilities")
    ids = ins[1]
    _check(ids.dtype == "i32" and len(ids.shape) == 2 and ids.shape[0] == rows,
           f"moe_weights experts must be i32[{rows},k], got {ids}")
    return f32(rows, ids.shape[1])


def _infer_moe_matmul(ins, a: MoeMatmulAttrs) -> TensorType:
    _n_inputs(ins, 3, Op.MOE_MATMUL)
    x, w, ids = ins
    rows, width = _activation(x, "moe_matmul input")
    _check(len(w.shape) == 3, f"moe_matmul weight must be stacked experts [E, n_out, K], got {w}")
    _check(ids.dtype == "i32" and len(ids.shape) == 2 and ids.shape[0] == rows,
           f"moe_matmul experts must be i32[{rows},k], got {ids}")
    n_used, k = ids.shape[1], w.shape[2]
    _check(width in (k, n_used * k), f"moe_matmul input must be {k} wide (shared by the {n_used} slots) or "
           f"{n_used} x {k} (one per slot), got {x}")
    _check(a.activations in ("q8", "f32"), f"moe_matmul activations must be q8 or f32, got {a.activations!r}")
    return f32(rows, n_used * w.shape[1])


def _infer_moe_sum(ins, a) -> TensorType:
    _n_inputs(ins, 2, Op.MOE_SUM)
    rows, width = _activation(ins[0], "moe_sum outputs")
    _, n_used = _activation(ins[1], "moe_sum weights")
    _check(ins[1].shape[0] == rows and isinstance(width, int) and width % n_used == 0,
           f"moe_sum needs {n_used} equal slots per row of {ins[0]}")
    return f32(rows, width // n_used)


# the formats a quantize node makes -> values per block
QUANTIZED_ROWS = {"q8_0": 32, "q8_1": 32, "q8_k": 256}


def _infer_quantize(ins, a: QuantizeAttrs) -> TensorType:
    _n_inputs(ins, 1, Op.QUANTIZE)
    rows, width = _activation(ins[0], "quantize input")
    _check(a.format in QUANTIZED_ROWS, f"quantize format must be one of {', '.join(QUANTIZED_ROWS)}, got {a.format!r}")
    _check(isinstance(width, int) and width % QUANTIZED_ROWS[a.format] == 0,
           f"{a.format} rows are whole blocks of {QUANTIZED_ROWS[a.format]} values, not {width}")
    return TensorType(a.format, (rows, width))


def _infer_add_rms_norm(ins, a: RmsNormAttrs) -> TensorType:
    out = _infer_rms_norm(ins, a)
    _check(a.group in (0, out.shape[1]), f"add_rms_norm normalizes whole rows, not groups of {a.group}")
    return out


def _infer_rope_pair(ins, a: RopeAttrs) -> TensorType:
    _n_inputs(ins, 3, Op.ROPE_PAIR)
    out = _infer_rope(ins[:2], a)
    rows, _ = _activation(ins[2], "rope_pair's other rotation")
    _check(rows == out.shape[0], f"rope_pair's rotations have different rows: {ins[0]} and {ins[2]}")
    return out


def _infer_binary(op: Op):
    def infer(ins, a) -> TensorType:
        _n_inputs(ins, 2, op)
        _activation(ins[0], f"{op.value} input")
        _check(ins[0] == ins[1], f"{op.value} operands differ: {ins[0]} vs {ins[1]}")
        return ins[0]

    return infer


def _infer_add_bias(ins, a) -> TensorType:
    _n_inputs(ins, 2, Op.ADD_BIAS)
    _, width = _activation(ins[0], "add_bias input")
    _check(ins[1] == f32(width), f"add_bias bias must be f32[{width}], got {ins[1]}")
    return ins[0]


def _infer_unary(op: Op):
    def infer(ins, a) -> TensorType:
        _n_inputs(ins, 1, op)
        _activation(ins[0], f"{op.value} input")
        return ins[0]

    return infer


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
    Op.INPUT: _spec(InputAttrs, _infer_input, ref.input_, Group.LEAF),
    Op.PARAM: _spec(ParamAttrs, None, ref.param, Group.LEAF),
    Op.STATE: _spec(StateAttrs, None, ref.state, Group.LEAF),
    Op.RECURRENT_STATE: _spec(RecurrentStateAttrs, None, ref.recurrent_state, Group.LEAF),
    Op.EMBED: _spec(EmbedAttrs, _infer_embed, ref.embed),
    Op.MATMUL: _spec(MatmulAttrs, _infer_matmul, ref.matmul, Group.REDUCE, order=orders.matmul_order),
    Op.TAKE_ROWS: _spec(NoAttrs, _infer_take_rows, ref.take_rows),
    Op.COLUMNS: _spec(ColumnsAttrs, _infer_columns, ref.columns),
    Op.RMS_NORM: _spec(RmsNormAttrs, _infer_rms_norm, ref.rms_norm, Group.REDUCE, order=orders.rms_norm_order),
    Op.LAYER_NORM: _spec(LayerNormAttrs, _infer_layer_norm, ref.layer_norm, Group.REDUCE,
                         order=orders.layer_norm_order),
    Op.ROPE: _spec(RopeAttrs, _infer_rope, ref.rope),
    Op.ATTENTION: _spec(AttentionAttrs, _infer_attention, ref.attention, Group.REDUCE,
                        order=orders.attention_order),
    Op.SHORT_CONV: _spec(NoAttrs, _infer_short_conv, ref.short_conv),
    Op.SSM_SCAN: _spec(SsmScanAttrs, _infer_ssm_scan, ref.ssm_scan),
    Op.DELTA_RULE: _spec(DeltaRuleAttrs, _infer_delta_rule, delta_ref.delta_rule),
    Op.HEAD_COLUMNS: _spec(HeadColumnsAttrs, _infer_head_columns, delta_ref.head_columns),
    Op.MOE_GATE: _spec(MoeGateAttrs, _infer_moe_gate, moe_ref.moe_gate),
    Op.MOE_SELECT: _spec(MoeSelectAttrs, _infer_moe_select, moe_ref.moe_select),
    Op.MOE_WEIGHTS: _spec(MoeWeightsAttrs, _infer_moe_weights, moe_ref.moe_weights),
    Op.MOE_MATMUL: _spec(MoeMatmulAttrs, _infer_moe_matmul, moe_ref.moe_matmul, Group.REDUCE,
                         order=orders.matmul_order),
    Op.MOE_SUM: _spec(NoAttrs, _infer_moe_sum, moe_ref.moe_sum),
    Op.ADD: _spec(NoAttrs, _infer_binary(Op.ADD), ref.add, Group.ELEMENTWISE),
    Op.ADD_BIAS: _spec(NoAttrs, _infer_add_bias, ref.add_bias),  # a broadcast: not ELEMENTWISE's same-position rule
    Op.MUL: _spec(NoAttrs, _infer_binary(Op.MUL), ref.mul, Group.ELEMENTWISE),
    Op.SCALE: _spec(ScaleAttrs, _infer_unary(Op.SCALE), ref.scale, Group.ELEMENTWISE),
    Op.SILU: _spec(NoAttrs, _infer_unary(Op.SILU), ref.silu, Group.ELEMENTWISE),
    Op.SIGMOID: _spec(NoAttrs, _infer_unary(Op.SIGMOID), delta_ref.sigmoid, Group.ELEMENTWISE),
    Op.GELU: _spec(NoAttrs, _infer_unary(Op.GELU), ref.gelu, Group.ELEMENTWISE),
    Op.SOFTCAP: _spec(SoftcapAttrs, _infer_unary(Op.SOFTCAP), ref.softcap, Group.ELEMENTWISE),
    Op.SWIGLU: _spec(NoAttrs, _infer_binary(Op.SWIGLU), ref.swiglu, Group.ELEMENTWISE),
    Op.GEGLU: _spec(NoAttrs, _infer_binary(Op.GEGLU), ref.geglu, Group.ELEMENTWISE),
    Op.ADD_RMS_NORM: _spec(RmsNormAttrs, _infer_add_rms_norm, ref.add_rms_norm, Group.REDUCE,
                           order=orders.rms_norm_order),
    Op.ROPE_PAIR: _spec(RopeAttrs, _infer_rope_pair, ref.rope_pair),
    Op.QUANTIZE: _spec(QuantizeAttrs, _infer_quantize, ref.quantize),
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
    _check(isinstance(attrs, cls), f"{op.value} needs {cls.__name__}, got {type(attrs).__name__}")


def infer_type(op: Op, input_types: list[TensorType], attrs) -> TensorType:
    """The output type of `op` on these inputs; raises VerifyError when they do not fit."""
    spec = spec_of(op)
    if spec.infer is None:
        raise VerifyError(f"{op.value} nodes carry their type; they are not inferred")
    check_attrs(op, attrs)
    result = spec.infer(input_types, attrs)
    if spec.order is not None and attrs.order:
        want = spec.order(input_types, attrs)
        _check(attrs.order == want, f"{op.value} order {attrs.order!r} is not the order its reference "
               f"follows on these inputs ({want!r})")
    return result


def reduction_order(op: Op, input_types: list[TensorType], attrs) -> str | None:
    """The order a node of `op` sums in: its `order` attribute, or, before the batch-invariance pass
    has written it (a graph built by hand), the one its spec gives; None for an op that does not reduce."""
    spec = spec_of(op)
    if spec.order is None:
        return None
    return attrs.order or spec.order(input_types, attrs)
