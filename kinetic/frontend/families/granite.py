"""The granite family: IBM Granite 3.x dense models (and Granite 4 files converted as `granite`).

Differences from llama (llama.cpp's src/models/granite.cpp and the embedding scale in its
build_inp_embd): four multipliers from the file, each a `scale` node exactly where llama.cpp's graph
multiplies, so the values round as there. The embedding rows are multiplied by `embedding_scale`;
each layer's attention output and feed-forward output by `residual_scale` before joining the
residual stream; attention scores use `attention.scale` instead of 1/sqrt(head size); the logits
are divided by `logit_scale` (multiplied by its f32 reciprocal, as ggml_scale(1/s) does). A missing
or zero multiplier is off, except logit_scale, which the file must give. `rope.scaling.finetuned`
false means no rotary at all. Rotary in the interleaved layout; output projection separate or tied.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Act, Blocks
from kinetic.frontend.families.base import Family, llama_facts
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.ir.ops import RopeAttrs


def _rope(g: GGUFFile, d: hp.Decoder) -> RopeAttrs | None:
    if not hp.key(g, "rope.scaling.finetuned", True):
        return None
    return hp.rope(g, n_head=d.n_head, head_dim=d.head_dim, neox=False)


def build(m: Blocks, *, ffn: Callable[[int, int], int] | None = None) -> int:
    """The graph; `ffn(h, layer)` replaces the dense feed-forward (granitemoe's experts)."""
    g = m.gguf
    d = hp.decoder(g, default_eps=1e-5)
    rope = _rope(g, d)
    embedding_scale = hp.key(g, "embedding_scale", 0.0)
    residual_scale = hp.key(g, "residual_scale", 0.0)
    kq_scale = hp.key(g, "attention.scale", 0.0) or 1.0 / math.sqrt(d.head_dim)
    logit_divisor = np.float32(hp.key(g, "logit_scale"))

    def residual(x: int, h: int) -> int:
        return m.add(x, m.scale(h, residual_scale) if residual_scale else h)

    positions = m.input("positions")
    x = m.embed("token_embd.weight", m.input("tokens"))  # f32 [T, n_embd]
    if embedding_scale:
        x = m.scale(x, embedding_scale)
    for il in range(d.n_layer):
        h = m.rms_norm(x, f"blk.{il}.attn_norm.weight", eps=d.eps)
        h = m.attention(h, layer=il, positions=positions, n_head=d.n_head, n_kv_head=d.n_kv_head,
                        head_dim=d.head_dim, rope=rope, scale=kq_scale)
        x = residual(x, h)
        h = m.rms_norm(x, f"blk.{il}.ffn_norm.weight", eps=d.eps)
        x = residual(x, ffn(h, il) if ffn else m.ffn(h, layer=il, act=Act.SILU))
    logits = m.head(x, eps=d.eps)  # f32 [R, n_vocab]
    return m.scale(logits, float(np.float32(1.0) / logit_divisor))


def facts(g: GGUFFile) -> dict[str, str]:
    """llama's facts, the multipliers, and no rotary when the file turns it off."""
    d = hp.decoder(g, default_eps=1e-5)
    out = llama_facts(g)
    if _rope(g, d) is None:
        out["rotary"] = "none (rope.scaling.finetuned is false)"
    attention = hp.key(g, "attention.scale", 0.0)
    out["multipliers"] = ", ".join((
        f"embedding x{hp.key(g, 'embedding_scale', 0.0) or 1:g}",
        f"residual branches x{hp.key(g, 'residual_scale', 0.0) or 1:g}",
        f"attention scores x{attention:g}" if attention else "attention scores x1/sqrt(head size)",
        f"logits / {hp.key(g, 'logit_scale'):g}",
    ))
    return out


FAMILY = Family(name="granite", architectures=("granite",), build=build, facts=facts)
