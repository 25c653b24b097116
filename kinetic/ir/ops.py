"""The op table: one enum of ops, a frozen attribute dataclass per op, and a spec per op.

A spec infers an op's output type from its input types and attributes and verifies them; an op
without a spec raises. Op properties are sets (ELEMENTWISE, REDUCE) rather than a class tree.
What each op computes is defined by the reference interpreter (kinetic/ir/interpreter.py).

Row semantics: activations are `f32[T, width]`, one row per token of the pass. Attention reads
which KV-cache entries each row may see from the pass's row table (sequence, position, parent),
which the runtime supplies; the graph only names the cache through a `state` node.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, fields

from kinetic.ir.types import R, T, TensorType, f32, i32


class Op(enum.Enum):
    # leaves
    INPUT = "input"  # per-pass data from the runtime: token ids, positions, output rows
    PARAM = "param"  # a weight, naming its GGUF tensor and keeping its stored type
    STATE = "state"  # runtime-owned state (KV cache) handle
    # lookups and projections
    EMBED = "embed"  # rows of a (possibly quantized) table
    MATMUL = "matmul"  # x @ w.T with w stored [n_out, n_in]
    TAKE_ROWS = "take_rows"  # select rows of x by index
    # normalization and position
    RMS_NORM = "rms_norm"
    ROPE = "rope"
    # attention over the KV cache
    ATTENTION = "attention"
    # elementwise
    ADD = "add"
    MUL = "mul"
    SCALE = "scale"
    SILU = "silu"
    GELU = "gelu"
    SOFTCAP = "softcap"
    # fused forms produced by passes
    SWIGLU = "swiglu"  # silu(gate) * up
    GEGLU = "geglu"  # gelu(gate) * up
    SPLIT = "split"  # a column slice of x: x[:, start:start+size]


ELEMENTWISE = {Op.ADD, Op.MUL, Op.SCALE, Op.SILU, Op.GELU, Op.SOFTCAP, Op.SWIGLU, Op.GEGLU}
REDUCE = {Op.MATMUL, Op.RMS_NORM, Op.ATTENTION}
LEAVES = {Op.INPUT, Op.PARAM, Op.STATE}


# ---- attributes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class NoAttrs:
    pass


@dataclass(frozen=True)
class InputAttrs:
    name: str  # "tokens", "positions" or "output_rows"


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
class EmbedAttrs:
    pass


@dataclass(frozen=True)
class MatmulAttrs:
    # "q8": activations are quantized to 8 bits per block first, as ggml's vec-dot does for
    # quantized weights (Q8_0 for legacy types, Q8_1 for Q4_1/Q5_1, Q8_K for k-quants);
    # "f32": plain float activations.
    activations: str = "q8"


@dataclass(frozen=True)
class RmsNormAttrs:
    eps: float
    group: int = 0  # normalize each consecutive group of this many values (per head); 0 = the whole row


@dataclass(frozen=True)
class RopeAttrs:
    n_head: int
    head_dim: int
    n_rot: int  # leading values of each head that rotate
    theta: float  # frequency base
    neox: bool  # NeoX layout (halves) instead of interleaved pairs
    freq_scale: float = 1.0  # linear scaling: positions multiplied by this
    # YaRN (0 = off): original context, extrapolation mix, attention factor, beta fast/slow
    yarn_orig_ctx: int = 0
    yarn_ext_factor: float = 0.0
    yarn_attn_factor: float = 1.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    # llama3 scaling (factor 0 = off)
    llama3_factor: float = 0.0
    llama3_low_freq_factor: float = 1.0
    llama3_high_freq_factor: float = 4.0
    llama3_orig_ctx: int = 8192


@dataclass(frozen=True)
class AttentionAttrs:
    n_head: int
    n_kv_head: int
    head_dim: int
    scale: float
    window: int = 0  # sliding window in positions (0 = none): a row at p sees positions > p - window
    softcap: float = 0.0  # logit soft-capping of the scores (0 = off)
    kv_dtype: str = "f16"  # how the cache stores keys and values


@dataclass(frozen=True)
class ScaleAttrs:
    factor: float


@dataclass(frozen=True)
class SoftcapAttrs:
    cap: float  # cap * tanh(x / cap)


@dataclass(frozen=True)
class SplitAttrs:
    start: int
    size: int


ATTRS: dict[Op, type] = {
    Op.INPUT: InputAttrs,
    Op.PARAM: ParamAttrs,
    Op.STATE: StateAttrs,
    Op.EMBED: EmbedAttrs,
    Op.MATMUL: MatmulAttrs,
    Op.TAKE_ROWS: NoAttrs,
    Op.RMS_NORM: RmsNormAttrs,
    Op.ROPE: RopeAttrs,
    Op.ATTENTION: AttentionAttrs,
    Op.ADD: NoAttrs,
    Op.MUL: NoAttrs,
    Op.SCALE: ScaleAttrs,
    Op.SILU: NoAttrs,
    Op.GELU: NoAttrs,
    Op.SOFTCAP: SoftcapAttrs,
    Op.SWIGLU: NoAttrs,
    Op.GEGLU: NoAttrs,
    Op.SPLIT: SplitAttrs,
}


def attr_fields(attrs) -> list[tuple[str, object]]:
    return [(f.name, getattr(attrs, f.name)) for f in fields(attrs)]


# ---- specs --------------------------------------------------------------------------------------


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


def _spec_input(ins, a: InputAttrs) -> TensorType:
    _n_inputs(ins, 0, Op.INPUT)
    _check(a.name in ("tokens", "positions", "output_rows"), f"unknown input {a.name!r}")
    return i32(R) if a.name == "output_rows" else i32(T)


def _spec_embed(ins, a) -> TensorType:
    _n_inputs(ins, 2, Op.EMBED)
    table, ids = ins
    _check(len(table.shape) == 2, f"embedding table must be 2-D, got {table}")
    _check(ids.dtype == "i32" and len(ids.shape) == 1, f"embedding ids must be i32[rows], got {ids}")
    return f32(ids.shape[0], table.shape[1])


def _spec_matmul(ins, a: MatmulAttrs) -> TensorType:
    _n_inputs(ins, 2, Op.MATMUL)
    x, w = ins
    rows, k = _activation(x, "matmul input")
    _check(len(w.shape) == 2, f"matmul weight must be 2-D, got {w}")
    _check(w.shape[1] == k, f"matmul width mismatch: input {x}, weight {w}")
    _check(a.activations in ("q8", "f32"), f"matmul activations must be q8 or f32, got {a.activations!r}")
    return f32(rows, w.shape[0])


def _spec_take_rows(ins, a) -> TensorType:
    _n_inputs(ins, 2, Op.TAKE_ROWS)
    x, idx = ins
    _, width = _activation(x, "take_rows input")
    _check(idx.dtype == "i32" and len(idx.shape) == 1, f"take_rows index must be i32[rows], got {idx}")
    return f32(idx.shape[0], width)


def _spec_rms_norm(ins, a: RmsNormAttrs) -> TensorType:
    _check(len(ins) in (1, 2), f"rms_norm takes x and an optional weight, got {len(ins)} inputs")
    rows, width = _activation(ins[0], "rms_norm input")
    group = a.group or width
    _check(isinstance(width, int) and width % group == 0, f"rms_norm group {a.group} does not divide {width}")
    if len(ins) == 2:
        _check(ins[1].shape == (group,), f"rms_norm weight must be [{group}], got {ins[1]}")
    _check(a.eps > 0, "rms_norm eps must be positive")
    return ins[0]


def _spec_rope(ins, a: RopeAttrs) -> TensorType:
    _n_inputs(ins, 2, Op.ROPE)
    x, pos = ins
    rows, width = _activation(x, "rope input")
    _check(width == a.n_head * a.head_dim, f"rope width {width} != {a.n_head} heads x {a.head_dim}")
    _check(0 < a.n_rot <= a.head_dim and a.n_rot % 2 == 0, f"rope n_rot {a.n_rot} invalid")
    _check(pos.dtype == "i32" and pos.shape == (rows,), f"rope positions must be i32[{rows}], got {pos}")
    return x


def _spec_attention(ins, a: AttentionAttrs) -> TensorType:
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


def _spec_binary(op: Op):
    def spec(ins, a) -> TensorType:
        _n_inputs(ins, 2, op)
        _activation(ins[0], f"{op.value} input")
        _check(ins[0] == ins[1], f"{op.value} operands differ: {ins[0]} vs {ins[1]}")
        return ins[0]

    return spec


def _spec_unary(op: Op):
    def spec(ins, a) -> TensorType:
        _n_inputs(ins, 1, op)
        _activation(ins[0], f"{op.value} input")
        return ins[0]

    return spec


def _spec_split(ins, a: SplitAttrs) -> TensorType:
    _n_inputs(ins, 1, Op.SPLIT)
    rows, width = _activation(ins[0], "split input")
    _check(a.start >= 0 and a.size > 0 and a.start + a.size <= width, f"split {a} outside width {width}")
    return f32(rows, a.size)


def _leaf(op: Op):
    def spec(ins, a) -> TensorType:
        raise VerifyError(f"{op.value} nodes carry their type; they are not inferred")

    return spec


SPECS: dict[Op, Callable] = {
    Op.INPUT: _spec_input,
    Op.PARAM: _leaf(Op.PARAM),
    Op.STATE: _leaf(Op.STATE),
    Op.EMBED: _spec_embed,
    Op.MATMUL: _spec_matmul,
    Op.TAKE_ROWS: _spec_take_rows,
    Op.RMS_NORM: _spec_rms_norm,
    Op.ROPE: _spec_rope,
    Op.ATTENTION: _spec_attention,
    Op.ADD: _spec_binary(Op.ADD),
    Op.MUL: _spec_binary(Op.MUL),
    Op.SWIGLU: _spec_binary(Op.SWIGLU),
    Op.GEGLU: _spec_binary(Op.GEGLU),
    Op.SCALE: _spec_unary(Op.SCALE),
    Op.SILU: _spec_unary(Op.SILU),
    Op.GELU: _spec_unary(Op.GELU),
    Op.SOFTCAP: _spec_unary(Op.SOFTCAP),
    Op.SPLIT: _spec_split,
}


def infer_type(op: Op, input_types: list[TensorType], attrs) -> TensorType:
    """The output type of `op` on these inputs; raises VerifyError when they do not fit."""
    spec = SPECS.get(op)
    if spec is None:
        raise VerifyError(f"op {op.value} has no spec")
    _check(isinstance(attrs, ATTRS[op]), f"{op.value} needs {ATTRS[op].__name__}, got {type(attrs).__name__}")
    return spec(input_types, attrs)
