"""Builders for Qwen3.5's two mixers: the Gated DeltaNet layer (a recurrent state per sequence) and
attention whose query projection carries an output gate.

Owns: `DeltaNet` (the layer's sizes from the ssm.* keys, refused by key unless they fit),
`gated_delta_net` (llama.cpp's qwen35 build_layer_attn_linear: attn_qkv through the causal conv and
SiLU, split into q, k and v; q and k L2-normed per head as llama.cpp's build_gdn_l2_norm does
(rms_norm with eps / S, then times 1/sqrt(S)); the delta rule over a state of S x S per value head;
RMS-normed per head with ssm_norm, times silu(attn_gate x); ssm_out) and `gated_attention`
(build_layer_attn: attn_q gives each head's query then its gate; q and k RMS-normed per head,
rotary, attention, times sigmoid(gate), attn_output).
Does not own the shared blocks (blocks.py, recurrent_blocks.py's states) nor what the ops compute
(kinetic/ir/delta_reference.py, docs/recurrent.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kinetic.errors import ModelFileError
from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Blocks
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.recurrent_blocks import recurrent_state
from kinetic.ir.ops import (
    AttentionAttrs,
    ColumnsAttrs,
    DeltaRuleAttrs,
    HeadColumnsAttrs,
    Op,
    RopeAttrs,
    StateAttrs,
)
from kinetic.ir.types import TensorType

F32 = np.float32


@dataclass(frozen=True)
class DeltaNet:
    """A Gated DeltaNet layer's sizes: S (ssm.state_size) per key and value head."""

    d_conv: int  # conv taps
    head_dim: int  # S
    n_k_head: int  # ssm.group_count
    n_v_head: int  # ssm.time_step_rank

    @property
    def conv_width(self) -> int:
        return (2 * self.n_k_head + self.n_v_head) * self.head_dim  # q, k, v

    @classmethod
    def read(cls, g: GGUFFile) -> DeltaNet:
        dims = cls(d_conv=hp.key(g, "ssm.conv_kernel"), head_dim=hp.key(g, "ssm.state_size"),
                   n_k_head=hp.key(g, "ssm.group_count"), n_v_head=hp.key(g, "ssm.time_step_rank"))
        inner = hp.key(g, "ssm.inner_size")
        checks = (("ssm.inner_size", inner, inner == dims.n_v_head * dims.head_dim,
                   f"ssm.time_step_rank x ssm.state_size ({dims.n_v_head * dims.head_dim}): value heads as wide "
                   "as key heads"),
                  ("ssm.time_step_rank", dims.n_v_head, dims.n_v_head % dims.n_k_head == 0,
                   f"a multiple of ssm.group_count ({dims.n_k_head})"))
        for suffix, value, ok, expected in checks:
            if not ok:
                raise ModelFileError(g.path.name, f"{g.architecture}.{suffix}", f"is {value}", expected)
        return dims


def l2_norm(m: Blocks, x: int, *, size: int, eps: float) -> int:
    """Each group of `size` values over its L2 norm as llama.cpp's build_gdn_l2_norm computes it:
    rms_norm with eps / size (an f32 division), then times 1 / sqrtf(size)."""
    scaled_eps = float(F32(eps) / F32(size))
    return m.scale(m.rms_norm(x, None, eps=scaled_eps, group=size), float(F32(1) / np.sqrt(F32(size))))


def gated_delta_net(m: Blocks, x: int, *, layer: int, dims: DeltaNet, eps: float) -> int:
    """A Gated DeltaNet mixer on normed rows x, f32 [T, n_embd] in and out (see the module docstring)."""
    p, d, s = f"blk.{layer}.", dims, dims.head_dim
    width, key_width, value_width = m.width(x), d.n_k_head * s, d.n_v_head * s
    qkv = m.linear(x, p + "attn_qkv.weight", n_out=d.conv_width, why=f"{width} in, q, k and v out")
    z = m.linear(x, p + "attn_gate.weight", n_out=value_width, why=f"{width} in, {d.n_v_head} value heads out")
    beta = m.linear(x, p + "ssm_beta.weight", n_out=d.n_v_head, why=f"{width} in, one per value head")
    alpha = m.linear(x, p + "ssm_alpha.weight", n_out=d.n_v_head, why=f"{width} in, one per value head")
    alpha = m.node(Op.ADD_BIAS, (alpha, m.weight(p + "ssm_dt.bias", (d.n_v_head,), "one per value head")))
    kernel = m.weight(p + "ssm_conv1d.weight", (d.d_conv, d.conv_width), f"ssm.conv_kernel {d.d_conv} taps per channel")
    conv_state = recurrent_state(m, name=f"conv.{layer}", layer=layer, rows=d.d_conv - 1, width=d.conv_width)
    conv = m.node(Op.SILU, (m.node(Op.SHORT_CONV, (qkv, kernel, conv_state)),))
    q, k, v = (m.node(Op.COLUMNS, (conv,), ColumnsAttrs(start, n))
               for start, n in ((0, key_width), (key_width, key_width), (2 * key_width, value_width)))
    q, k = (l2_norm(m, t, size=s, eps=eps) for t in (q, k))
    decay = m.weight(p + "ssm_a", (d.n_v_head,), "one decay per value head")
    state = recurrent_state(m, name=f"delta.{layer}", layer=layer, rows=value_width, width=s)
    y = m.node(Op.DELTA_RULE, (q, k, v, alpha, beta, decay, state), DeltaRuleAttrs(d.n_k_head, d.n_v_head, s))
    y = m.node(Op.MUL, (m.rms_norm(y, p + "ssm_norm.weight", eps=eps, group=s), m.node(Op.SILU, (z,))))
    return m.linear(y, p + "ssm_out.weight", n_out=width, why=f"{value_width} in, the width {width} out")


def gated_attention(m: Blocks, x: int, *, layer: int, positions: int, n_head: int, n_kv_head: int, head_dim: int,
                    rope: RopeAttrs, eps: float, prefix: str = "") -> int:
    """Attention with an output gate on normed rows x, f32 [T, n_embd] in and out (see the module
    docstring); `prefix` names the tensors' block when it is not blk.<layer>. (a prediction block's)."""
    p = prefix or f"blk.{layer}."
    width, q_width, kv_width = m.width(x), n_head * head_dim, n_kv_head * head_dim
    both = m.linear(x, p + "attn_q.weight", n_out=2 * q_width, why=f"{width} in, {n_head} heads x (query, gate) out")
    q, gate = (m.node(Op.HEAD_COLUMNS, (both,), HeadColumnsAttrs(n_head, 2 * head_dim, start, head_dim))
               for start in (0, head_dim))
    kv_why = f"{width} in, {n_kv_head} KV heads x {head_dim} out"
    k = m.linear(x, p + "attn_k.weight", n_out=kv_width, why=kv_why)
    v = m.linear(x, p + "attn_v.weight", n_out=kv_width, why=kv_why)
    q = m.rms_norm(q, p + "attn_q_norm.weight", eps=eps, group=head_dim)
    k = m.rms_norm(k, p + "attn_k_norm.weight", eps=eps, group=head_dim)
    q = m.node(Op.ROPE, (q, positions), rope)
    k = m.node(Op.ROPE, (k, positions), RopeAttrs(**{**rope.__dict__, "n_head": n_kv_head}))
    state = m.node(Op.STATE, (), StateAttrs(f"kv.{layer}", layer, n_kv_head, head_dim), TensorType("kv", ()))
    scale = float(F32(1) / np.sqrt(F32(head_dim)))
    attrs = AttentionAttrs(n_head, n_kv_head, head_dim, scale, 0, 0.0, m.options.kv_dtype)
    out = m.node(Op.ATTENTION, (q, k, v, state), attrs)
    out = m.node(Op.MUL, (out, m.node(Op.SIGMOID, (gate,))))
    return m.linear(out, p + "attn_output.weight", n_out=width, why=f"{q_width} in, the width {width} out")
