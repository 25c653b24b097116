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
from dataclasses import dataclass

import numpy as np

from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Blocks
from kinetic.frontend.families.base import Family, llama_facts
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.recurrent_blocks import hybrid_decoder
from kinetic.ir.ops import RopeAttrs


@dataclass(frozen=True)
class Multipliers:
    """Granite's four multipliers as the file gives them (0.0: off); granitehybrid reads them too."""

    embedding: float
    residual: float
    attention: float  # 0.0: 1/sqrt(head size)
    logit: float | None  # None: no logit divisor (granitehybrid without logit_scale)

    @classmethod
    def read(cls, g: GGUFFile, *, logit_required: bool) -> Multipliers:
        """The file's multipliers; `logit_required`: a missing logit_scale is refused by name (granite)."""
        logit = hp.key(g, "logit_scale") if logit_required else (hp.key(g, "logit_scale", None) or None)
        return cls(embedding=hp.key(g, "embedding_scale", 0.0), residual=hp.key(g, "residual_scale", 0.0),
                   attention=hp.key(g, "attention.scale", 0.0), logit=logit)

    def kq_scale(self, head_dim: int) -> float:
        return self.attention or 1.0 / math.sqrt(head_dim)

    def divide_logits(self, m: Blocks, logits: int) -> int:
        """logits times the f32 reciprocal of logit_scale (as ggml_scale(1/s) does): f32 [R, n_vocab]."""
        if self.logit is None:
            return logits
        return m.scale(logits, float(np.float32(1.0) / np.float32(self.logit)))

    def fact(self) -> str:
        """What `kinetic info` says about them."""
        return ", ".join((
            f"embedding x{self.embedding or 1:g}",
            f"residual branches x{self.residual or 1:g}",
            f"attention scores x{self.attention:g}" if self.attention else "attention scores x1/sqrt(head size)",
            f"logits / {1 if self.logit is None else self.logit:g}",
        ))


def _rope(g: GGUFFile, d: hp.Decoder) -> RopeAttrs | None:
    if not hp.key(g, "rope.scaling.finetuned", True):
        return None
    return hp.rope(g, n_head=d.n_head, head_dim=d.head_dim, neox=False)


def build(m: Blocks, *, ffn: Callable[[int, int], int] | None = None) -> int:
    """The graph; `ffn(h, layer)` replaces the dense feed-forward (granitemoe's experts)."""
    g = m.gguf
    d = hp.decoder(g, default_eps=1e-5)
    rope = _rope(g, d)
    scales = Multipliers.read(g, logit_required=True)
    positions = m.input("positions")

    def attention(il: int, h: int) -> int:
        return m.attention(h, layer=il, positions=positions, n_head=d.n_head, n_kv_head=d.n_kv_head,
                           head_dim=d.head_dim, rope=rope, scale=scales.kq_scale(d.head_dim))

    logits = hybrid_decoder(m, n_layer=d.n_layer, eps=d.eps, mixer=attention, embedding_scale=scales.embedding,
                            residual_scale=scales.residual, ffn=ffn)
    return scales.divide_logits(m, logits)


def facts(g: GGUFFile) -> dict[str, str]:
    """llama's facts, the multipliers, and no rotary when the file turns it off."""
    d = hp.decoder(g, default_eps=1e-5)
    out = llama_facts(g)
    if _rope(g, d) is None:
        out["rotary"] = "none (rope.scaling.finetuned is false)"
    out["multipliers"] = Multipliers.read(g, logit_required=True).fact()
    return out


FAMILY = Family(name="granite", architectures=("granite",), build=build, facts=facts)
