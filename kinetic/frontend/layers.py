"""The llama-like decoder that most families are: embed, N layers of attention and a gated
feed-forward each added to the residual stream, then the final norm and the output projection.

Owns: the loop over layers and where each layer's norms sit (`Norms`: before each sub-block as in
llama, after it as in olmo2, or both as in gemma3), and `Attention`, the attention keywords of a
layer as one value that a family builds once (or per layer, for sliding-window patterns). Does not
own the blocks themselves (blocks.py: attention, ffn, norms, strict tensor checks) or reading
hyperparameters (hparams.py). A family whose layers differ from this shape writes its own loop on
blocks.py.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass

from kinetic.errors import ModelFileError
from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Act, Blocks
from kinetic.ir.ops import RopeAttrs


class Norms(enum.Enum):
    """Where a layer's RMS norms sit around attention and the feed-forward."""

    PRE = "pre"  # x += attn(attn_norm(x)); x += ffn(ffn_norm(x))  (llama)
    POST = "post"  # x += post_attention_norm(attn(x)); x += post_ffw_norm(ffn(x))  (olmo2)
    BOTH = "both"  # x += post_attention_norm(attn(attn_norm(x))) ...  (gemma3)


@dataclass(frozen=True)
class Attention:
    """The keywords of Blocks.attention that describe a layer's attention (see its docstring)."""

    n_head: int
    n_kv_head: int
    head_dim: int
    rope: RopeAttrs | None  # None: no rotary in the layer (exaone4's global layers)
    scale: float
    window: int = 0
    qk_norm: str | None = None
    qk_norm_eps: float | None = None
    qk_norm_after_rope: bool = False
    q_prescale: bool = False
    bias: bool = False

    @classmethod
    def of(cls, d: hp.Decoder, *, rope: RopeAttrs | None, **options) -> Attention:
        """The decoder's head counts and sizes, scale 1/sqrt(head size), and the given options."""
        return cls(n_head=d.n_head, n_kv_head=d.n_kv_head, head_dim=d.head_dim, rope=rope,
                   scale=1.0 / math.sqrt(d.head_dim), **options)


def whole_head_rope(m: Blocks, d: hp.Decoder, *, neox: bool, theta: float | None = None) -> RopeAttrs:
    """The file's rotary configuration, refused unless it rotates every value of a head (llama.cpp's
    graphs for qwen3, ernie4_5 and hunyuan-dense assert n_rot == head size)."""
    rope = hp.rope(m.gguf, n_head=d.n_head, head_dim=d.head_dim, neox=neox, theta=theta)
    if rope.n_rot != d.head_dim:
        raise ModelFileError(m.gguf.path.name, f"{m.gguf.architecture}.rope.dimension_count",
                             f"is {rope.n_rot}", f"the head size {d.head_dim}: family {m.family} rotates whole heads")
    return rope


_PRE_NORMS = ("attn_norm", "ffn_norm")
_POST_NORMS = ("post_attention_norm", "post_ffw_norm")


def layer(m: Blocks, x: int, *, index: int, positions: int, eps: float, attention: Attention,
          act: Act = Act.SILU, norms: Norms = Norms.PRE, ffn: Callable[[int, int], int] | None = None) -> int:
    """One decoder layer on the residual stream x, f32 [T, n_embd] in and out; `ffn(h, layer)` replaces
    the gated feed-forward (a mixture of experts, moe_blocks.py)."""
    p = f"blk.{index}."
    attend = attention.__dict__

    def sublayer(x: int, pre: str, post: str, body: Callable[[int], int]) -> int:
        h = x if norms is Norms.POST else m.rms_norm(x, p + pre + ".weight", eps=eps)
        h = body(h)
        if norms is not Norms.PRE:
            h = m.rms_norm(h, p + post + ".weight", eps=eps)
        return m.add(x, h)

    x = sublayer(x, _PRE_NORMS[0], _POST_NORMS[0],
                 lambda h: m.attention(h, layer=index, positions=positions, **attend))
    feed_forward = (lambda h: ffn(h, index)) if ffn else (lambda h: m.ffn(h, layer=index, act=act))
    return sublayer(x, _PRE_NORMS[1], _POST_NORMS[1], feed_forward)


def decoder(m: Blocks, *, d: hp.Decoder, attention: Attention | Callable[[int], Attention],
            act: Act = Act.SILU, norms: Norms = Norms.PRE, ffn: Callable[[int, int], int] | None = None) -> int:
    """The whole model: embedding, d.n_layer layers, head; returns the logits, f32 [R, n_vocab].
    `attention` is one value for every layer, or a function of the layer index."""
    attention_of = attention if callable(attention) else (lambda _: attention)
    positions = m.input("positions")
    x = m.embed("token_embd.weight", m.input("tokens"))  # f32 [T, n_embd]
    for il in range(d.n_layer):
        x = layer(m, x, index=il, positions=positions, eps=d.eps, attention=attention_of(il), act=act,
                  norms=norms, ffn=ffn)
    return m.head(x, eps=d.eps)  # f32 [R, n_vocab]
