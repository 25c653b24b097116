"""The op group of normalization, position and attention: rms_norm, layer_norm, rope, attention (over
the KV cache its `state` leaf names) and the device forms add_rms_norm and rope_pair.

Owns: their attribute dataclasses and shape inference (`infer_<op>`). Does not own: the table that
binds them to ops, references and reduction orders (kinetic/ir/ops.py, the import surface for every
name here).
"""

from __future__ import annotations

from dataclasses import dataclass

from kinetic.ir.numerics.rotary import Rotary
from kinetic.ir.op_groups.checks import activation, check, n_inputs
from kinetic.ir.types import TensorType


@dataclass(frozen=True)
class StateAttrs:
    name: str  # e.g. "kv.3"
    layer: int
    n_kv_head: int
    head_dim: int


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


def infer_rms_norm(ins, a: RmsNormAttrs) -> TensorType:
    check(len(ins) in (1, 2), f"rms_norm takes x and an optional weight, got {len(ins)} inputs")
    rows, width = activation(ins[0], "rms_norm input")
    group = a.group or width
    check(isinstance(width, int) and width % group == 0, f"rms_norm group {a.group} does not divide {width}")
    if len(ins) == 2:
        check(ins[1].shape == (group,), f"rms_norm weight must be [{group}], got {ins[1]}")
    check(a.eps > 0, "rms_norm eps must be positive")
    return ins[0]


def infer_layer_norm(ins, a: LayerNormAttrs) -> TensorType:
    check(len(ins) in (1, 2), f"layer_norm takes x and an optional weight, got {len(ins)} inputs")
    rows, width = activation(ins[0], "layer_norm input")
    if len(ins) == 2:
        check(ins[1].shape == (width,), f"layer_norm weight must be [{width}], got {ins[1]}")
    check(a.eps >= 0, "layer_norm eps must not be negative")
    return ins[0]


def infer_rope(ins, a: RopeAttrs) -> TensorType:
    n_inputs(ins, 2, "rope")
    x, pos = ins
    rows, width = activation(x, "rope input")
    check(width == a.n_head * a.head_dim, f"rope width {width} != {a.n_head} heads x {a.head_dim}")
    check(0 < a.n_rot <= a.head_dim and a.n_rot % 2 == 0, f"rope n_rot {a.n_rot} invalid")
    check(pos.dtype == "i32" and pos.shape == (rows,), f"rope positions must be i32[{rows}], got {pos}")
    check(not a.freq_factors or len(a.freq_factors) == a.n_rot // 2,
           f"rope needs {a.n_rot // 2} freq factors (one per rotated pair), got {len(a.freq_factors)}")
    check(all(f > 0 for f in a.freq_factors), "rope freq factors must be positive")
    check(a.freq_scale > 0 and (not a.yarn_ext_factor or a.yarn_orig_ctx > 0),
           "rope needs a positive freq_scale, and YaRN its original context")
    return x


def infer_attention(ins, a: AttentionAttrs) -> TensorType:
    n_inputs(ins, 4, "attention")
    q, k, v, kv = ins
    rows, qw = activation(q, "attention q")
    check(qw == a.n_head * a.head_dim, f"attention q width {qw} != {a.n_head} x {a.head_dim}")
    for t, name in ((k, "k"), (v, "v")):
        r, w = activation(t, f"attention {name}")
        check(r == rows and w == a.n_kv_head * a.head_dim, f"attention {name} must be f32[{rows},"
               f"{a.n_kv_head * a.head_dim}], got {t}")
    check(kv.dtype == "kv", f"attention state must be a kv handle, got {kv}")
    check(a.n_head % a.n_kv_head == 0, "attention heads must be a multiple of kv heads")
    check(a.kv_dtype in ("f16", "f32"), f"kv cache dtype must be f16 or f32, got {a.kv_dtype!r}")
    return q


def infer_add_rms_norm(ins, a: RmsNormAttrs) -> TensorType:
    out = infer_rms_norm(ins, a)
    check(a.group in (0, out.shape[1]), f"add_rms_norm normalizes whole rows, not groups of {a.group}")
    return out


def infer_rope_pair(ins, a: RopeAttrs) -> TensorType:
    n_inputs(ins, 3, "rope_pair")
    out = infer_rope(ins[:2], a)
    rows, _ = activation(ins[2], "rope_pair's other rotation")
    check(rows == out.shape[0], f"rope_pair's rotations have different rows: {ins[0]} and {ins[2]}")
    return out
