"""The hunyuan-dense family: Tencent's Hunyuan dense models (0.5B to 7B).

Differences from llama (llama.cpp's src/models/hunyuan-vl.cpp, whose graph hunyuan-dense reuses):
q and k are RMS-normed per head AFTER rotary (qwen3 norms before); rotary uses the NeoX layout
over the whole head. A file's rope.scaling.alpha (NTK-aware alpha) is folded into the base as
llama.cpp's loader does, in float32: base * alpha^(head/(head-2)); Hunyuan's converter usually
folds it already and writes no alpha. Multi-section rotary (rope.dimension_sections, Hunyuan-VL's
XD-RoPE) is refused by name. Pre-norm decoder with a SiLU-gated feed-forward.
"""

from __future__ import annotations

import numpy as np

from kinetic.errors import ModelFileError
from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Blocks
from kinetic.frontend.families.base import Family, attention_fact, rotary_fact
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.layers import Attention, decoder, whole_head_rope


def rope_base(g: GGUFFile, d: hp.Decoder) -> float:
    """The rotary base with the NTK alpha applied (float32, as llama.cpp computes it)."""
    base = np.float32(hp.key(g, "rope.freq_base", 10000.0))
    alpha = hp.key(g, "rope.scaling.alpha", 0.0)
    if alpha <= 0.0:
        return float(base)
    with np.errstate(all="ignore"):
        exponent = np.float32(d.head_dim) / np.float32(d.head_dim - 2)
        scaled = base * np.power(np.float32(alpha), exponent)
    if not (np.isfinite(scaled) and scaled > 0):
        raise ModelFileError(g.path.name, f"{g.architecture}.rope.scaling.alpha", f"is {alpha}",
                             f"an alpha that keeps the rotary base finite for heads of {d.head_dim}")
    return float(scaled)


def build(m: Blocks) -> int:
    sections = f"{m.gguf.architecture}.rope.dimension_sections"
    if sections in m.gguf.metadata:
        raise ModelFileError(m.gguf.path.name, sections, "is present", "no multi-section rotary (XD-RoPE)",
                             "Hunyuan-VL's multi-section rotary is not supported yet; use a text-only Hunyuan file.")
    d = hp.decoder(m.gguf, default_eps=1e-5)
    rope = whole_head_rope(m, d, neox=True, theta=rope_base(m.gguf, d))
    return decoder(m, d=d, attention=Attention.of(d, rope=rope, qk_norm="head", qk_norm_eps=d.eps,
                                                  qk_norm_after_rope=True))


def facts(g: GGUFFile) -> dict[str, str]:
    """Heads, NeoX rotary with the alpha-scaled base, the q/k norms after rotary."""
    d = hp.decoder(g, default_eps=1e-5)
    rope = hp.rope(g, n_head=d.n_head, head_dim=d.head_dim, neox=True, theta=rope_base(g, d))
    alpha = hp.key(g, "rope.scaling.alpha", 0.0)
    rotary = rotary_fact(rope) + (f", NTK alpha {alpha:g} folded into the base" if alpha > 0 else "")
    return {"attention": attention_fact(d), "rotary": rotary, "norm eps": f"{d.eps:g}",
            "norms": "q and k RMS-normed per head, after rotary"}


FAMILY = Family(name="hunyuan-dense", architectures=("hunyuan-dense",), build=build, facts=facts)
