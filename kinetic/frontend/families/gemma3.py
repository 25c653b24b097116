"""The gemma3 family: Gemma 3 text models.

Differences from llama: the embedding is scaled by sqrt(width); five sliding-window layers (local
rotary base 10000) alternate with one global layer (the file's base); q and k are RMS-normed per
head; norms sit before and after both attention and feed-forward; the feed-forward uses GELU;
rotary uses the NeoX layout; q is multiplied by 1/sqrt(head size) before attention (as
llama.cpp's gemma3 graph does), not inside it. The GGUF converter has
already folded Gemma's `1 + w` into the norm weights, so they are used as stored.
"""

from __future__ import annotations

import math

from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Act, Blocks
from kinetic.frontend.families.base import Family, decoder_facts, number
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.windows import describe

SWA_PATTERN = 6  # layers il with il % 6 == 5 are global (llama.cpp's gemma3 pattern)
LOCAL_ROPE_BASE = 10000.0


def build(m: Blocks) -> int:
    g = m.gguf
    d = hp.decoder(g, default_eps=1e-6)
    window = int(hp.key(g, "attention.sliding_window", 0))
    global_rope = hp.rope(g, n_head=d.n_head, head_dim=d.head_dim, neox=True)
    local_base = float(hp.key(g, "rope.freq_base_swa", LOCAL_ROPE_BASE))
    local_rope = hp.rope(g, n_head=d.n_head, head_dim=d.head_dim, neox=True, theta=local_base, swa=True)

    positions = m.input("positions")
    x = m.embed("token_embd.weight", m.input("tokens"))
    x = m.scale(x, math.sqrt(d.n_embd))  # f32 [T, n_embd]
    for il in range(d.n_layer):
        is_local = _is_local(window, il)
        p = f"blk.{il}."
        h = m.rms_norm(x, p + "attn_norm.weight", eps=d.eps)
        h = m.attention(h, layer=il, positions=positions, n_head=d.n_head, n_kv_head=d.n_kv_head,
                        head_dim=d.head_dim, rope=local_rope if is_local else global_rope,
                        scale=1.0 / math.sqrt(d.head_dim), window=window if is_local else 0,
                        qk_norm="head", qk_norm_eps=d.eps, q_prescale=True)
        x = m.add(x, m.rms_norm(h, p + "post_attention_norm.weight", eps=d.eps))
        h = m.rms_norm(x, p + "ffn_norm.weight", eps=d.eps)
        h = m.ffn(h, layer=il, act=Act.GELU)
        x = m.add(x, m.rms_norm(h, p + "post_ffw_norm.weight", eps=d.eps))
    return m.head(x, eps=d.eps)


def _is_local(window: int, il: int) -> bool:
    return window > 0 and il % SWA_PATTERN < SWA_PATTERN - 1


def facts(g: GGUFFile) -> dict[str, str]:
    """Heads, rotary (global and local bases), the embedding scale, norms, GELU and the window."""
    d = hp.decoder(g, default_eps=1e-6)
    window = int(hp.key(g, "attention.sliding_window", 0))
    local_base = float(hp.key(g, "rope.freq_base_swa", LOCAL_ROPE_BASE))
    out = decoder_facts(g, default_eps=1e-6, neox=True)
    out["rotary"] += f"; base {number(local_base)} on sliding layers" if window else ""
    out["multipliers"] = f"embedding x sqrt(width) = {math.sqrt(d.n_embd):g}, q x 1/sqrt(head size) before attention"
    out["norms"] = "q and k RMS-normed per head; before and after attention and feed-forward"
    out["feed-forward"] = "GELU-gated"
    out["sliding window"] = describe(tuple(_is_local(window, il) for il in range(d.n_layer)), window)
    return out


FAMILY = Family(name="gemma3", architectures=("gemma3",), build=build, facts=facts)
