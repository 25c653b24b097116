"""The mixture-of-experts feed-forward, as llama.cpp's build_moe_ffn assembles it (docs/moe.md).

Owns: `Experts`, a layer's routing settings read once from the file (how many experts, how many per
row, their width, the gate, renormalization, scale), and `moe_ffn`, which turns them into IR: the
router (`ffn_gate_inp`, a plain matmul), moe_gate, moe_select (with the file's `exp_probs_b` bias
when it has one), moe_weights, the experts' gate/up/down on the stacked `ffn_{gate,up,down}_exps`
tensors (moe_matmul, SiLU-gated; or the fused `ffn_gate_up_exps`, split per slot), and moe_sum; plus
the shared expert (`ffn_{gate,up,down}_shexp`) some families add, ungated or gated by
sigmoid(`ffn_gate_inp_shexp` . x). Does not own the ops' meaning
(kinetic/ir/moe_reference.py) or the layers around it (the family, layers.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from kinetic.errors import ModelFileError
from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Blocks
from kinetic.ir.ops import (
    HeadColumnsAttrs,
    MatmulAttrs,
    MoeGateAttrs,
    MoeMatmulAttrs,
    MoeSelectAttrs,
    MoeWeightsAttrs,
    Op,
)
from kinetic.ir.types import TensorType

GATING_FUNCS = {1: "softmax", 2: "sigmoid"}  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE values


@dataclass(frozen=True)
class Experts:
    """A MoE layer's routing: n_used of n_expert experts per row, each n_ff wide (None: the tensors' own)."""

    n_expert: int
    n_used: int
    n_ff: int | None
    gating: str = "softmax"
    normalize: bool = True
    scale: float = 0.0  # 0 or 1: the weights are not scaled

    @classmethod
    def of(cls, m: Blocks, *, gating: str | None = None, normalize: bool | None = None,
           scale: float | None = None) -> Experts:
        """The file's expert counts and width; the gate, renormalization and scale the family fixes (as
        llama.cpp's graph and loader fix them: a key its loader never reads has no effect) or, when
        None, the file's keys."""
        g = m.gguf
        n_expert, n_used = hp.key(g, "expert_count"), hp.key(g, "expert_used_count")
        if n_used > n_expert:
            raise ModelFileError(g.path.name, f"{g.architecture}.expert_used_count", f"is {n_used}",
                                 f"at most expert_count ({n_expert})")
        if gating is None:
            func = hp.key(g, "expert_gating_func", 1)
            if func not in GATING_FUNCS:
                raise ModelFileError(g.path.name, f"{g.architecture}.expert_gating_func", f"is {func}",
                                     "1 (softmax) or 2 (sigmoid): other gates are not supported yet")
            gating = GATING_FUNCS[func]
        if normalize is None:
            normalize = hp.key(g, "expert_weights_norm", False)
        if scale is None:
            scale = hp.key(g, "expert_weights_scale", 0.0)
        return cls(n_expert=n_expert, n_used=n_used, n_ff=hp.key(g, "expert_feed_forward_length", None),
                   gating=gating, normalize=normalize, scale=scale)


def _expert_linear(m: Blocks, x: int, ids: int, name: str, *, n_in: int | None, n_out: int | None,
                   n_expert: int, why: str) -> int:
    """moe_matmul of x (shared by the slots, or one input per slot) with the stacked weight `name`,
    GGUF shape [n_in, n_out, n_expert]."""
    w = m.weight(name, (n_in, n_out, n_expert), why)
    return m.node(Op.MOE_MATMUL, (x, w, ids), MoeMatmulAttrs(m.options.activations))


def moe_ffn(m: Blocks, x: int, *, layer: int, experts: Experts) -> int:
    """The routed experts' weighted sum for each row of x, f32 [T, width] in and out."""
    p, width, e = f"blk.{layer}.", m.width(x), experts
    logits = m.linear(x, p + "ffn_gate_inp.weight", n_out=e.n_expert, why=f"{width} in, one logit per expert")
    probs = m.node(Op.MOE_GATE, (logits,), MoeGateAttrs(e.gating))  # f32 [T, n_expert]
    bias = p + "exp_probs_b.bias"
    biased = (m.weight(bias, (e.n_expert,), "one selection bias per expert"),) if m.has(bias) else ()
    ids = m.node(Op.MOE_SELECT, (probs, *biased), MoeSelectAttrs(e.n_used))  # i32 [T, n_used]
    weights = m.node(Op.MOE_WEIGHTS, (probs, ids), MoeWeightsAttrs(e.normalize, e.scale))  # f32 [T, n_used]
    counts = dict(n_expert=e.n_expert)
    if m.has(p + "ffn_gate_up_exps.weight"):
        gate, up = _fused_gate_up(m, x, ids, p + "ffn_gate_up_exps.weight", experts=e)
    else:
        gate = _expert_linear(m, x, ids, p + "ffn_gate_exps.weight", n_in=width, n_out=e.n_ff, **counts,
                              why=f"{width} in, expert_feed_forward_length out, per expert")
        up = _expert_linear(m, x, ids, p + "ffn_up_exps.weight", n_in=width, n_out=m.width(gate) // e.n_used,
                            **counts, why=f"{width} in, as many out as ffn_gate_exps")
    n_ff = m.width(gate) // e.n_used
    h = m.node(Op.MUL, (m.node(Op.SILU, (gate,)), up))  # f32 [T, n_used * n_ff]
    down = _expert_linear(m, h, ids, p + "ffn_down_exps.weight", n_in=n_ff, n_out=width, **counts,
                          why=f"{n_ff} in, the width {width} out")
    return m.node(Op.MOE_SUM, (down, weights))  # f32 [T, width]


def _fused_gate_up(m: Blocks, x: int, ids: int, name: str, *, experts: Experts) -> tuple[int, int]:
    """The experts' gate and up from one stacked [n_ff * 2] weight (llama.cpp's ffn_gate_up_exps): each
    slot's first n_ff outputs are the gate, the next n_ff the up (head_columns per slot)."""
    width, e = m.width(x), experts
    n_out = 2 * e.n_ff if e.n_ff else None
    both = _expert_linear(m, x, ids, name, n_in=width, n_out=n_out, n_expert=e.n_expert,
                          why=f"{width} in, 2 x expert_feed_forward_length out (gate, then up), per expert")
    stride = m.width(both) // e.n_used  # f32 [T, n_used * 2 n_ff]
    gate, up = (m.node(Op.HEAD_COLUMNS, (both,), HeadColumnsAttrs(e.n_used, stride, start, stride // 2))
                for start in (0, stride // 2))
    return gate, up


def gated_shared_expert(m: Blocks, x: int, *, layer: int, n_ff: int | None) -> int:
    """The shared expert times sigmoid(ffn_gate_inp_shexp . x), one gate value per row (qwen35moe);
    the gate's product is a one-slot moe_sum, one f32 multiply per value as ggml_mul's broadcast."""
    name = f"blk.{layer}.ffn_gate_inp_shexp.weight"
    info = m._checked_tensor(name, (m.width(x),), "one gate weight per input value")
    w = m.b.param(name, TensorType(info.type.name.lower(), (1, m.width(x))))  # a [1, width] matrix
    gate = m.node(Op.SIGMOID, (m.node(Op.MATMUL, (x, w), MatmulAttrs(m.options.activations)),))  # f32 [T, 1]
    return m.node(Op.MOE_SUM, (shared_expert(m, x, layer=layer, n_ff=n_ff), gate))


def shared_expert(m: Blocks, x: int, *, layer: int, n_ff: int | None) -> int:
    """The shared expert every row runs: down(silu(gate(x)) * up(x)) on `ffn_*_shexp`."""
    p, width = f"blk.{layer}.", m.width(x)
    gate = m.linear(x, p + "ffn_gate_shexp.weight", n_out=n_ff or None,
                    why=f"{width} in, expert_shared_feed_forward_length out")
    n_ff = m.width(gate)
    up = m.linear(x, p + "ffn_up_shexp.weight", n_out=n_ff, why=f"{width} in, {n_ff} out as ffn_gate_shexp")
    return m.linear(m.node(Op.MUL, (m.node(Op.SILU, (gate,)), up)), p + "ffn_down_shexp.weight", n_out=width,
                    why=f"{n_ff} in, the width {width} out")
