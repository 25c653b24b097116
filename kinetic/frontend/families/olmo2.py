"""The olmo2 family: OLMo 2 and Olmo 3 (converted as olmo2) dense models.

Differences from llama (llama.cpp's src/models/olmo2.cpp): no norm before attention or the
feed-forward; instead each sub-block's output is RMS-normed (post_attention_norm, post_ffw_norm)
before joining the residual stream. q and k are RMS-normed over their whole projection (attn_q_norm
holds n_head*head_dim values, attn_k_norm n_kv_head*head_dim) before rotary, which uses the NeoX
layout over the whole head. Olmo 3 files give `attention.sliding_window`: then the layers the
pattern marks (src/llama-model.cpp: the file's per-layer booleans, else every 4th layer global)
attend over that window with plain rotary (no YaRN: freq scale 1, as olmo2.cpp passes), and the
others globally with the file's scaling. No layer reads a rope_freqs tensor (a file with one is
refused by name, as llama.cpp refuses it). Output projection untied.
"""

from __future__ import annotations

from dataclasses import replace

from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Blocks
from kinetic.frontend.families.base import Family, decoder_facts
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.layers import Attention, Norms, decoder, whole_head_rope
from kinetic.frontend.windows import describe, sliding_layers

SWA_PERIOD = 4  # llama.cpp's default pattern for olmo2 files with a window: layer il % 4 == 3 is global


def _sliding(g: GGUFFile, d: hp.Decoder) -> tuple[int, tuple[bool, ...]]:
    """The window and which layers use it; no layer slides without a positive window."""
    window = int(hp.key(g, "attention.sliding_window", 0))
    if window == 0:
        return 0, (False,) * d.n_layer
    return window, sliding_layers(g, n_layer=d.n_layer, default_period=SWA_PERIOD)


def build(m: Blocks) -> int:
    d = hp.decoder(m.gguf, default_eps=1e-6)
    rope = replace(whole_head_rope(m, d, neox=True), freq_factors=())  # olmo2.cpp passes no rope_freqs
    plain_rope = replace(rope, freq_scale=1.0, yarn_ext_factor=0.0, yarn_attn_factor=1.0, yarn_orig_ctx=0)
    window, sliding = _sliding(m.gguf, d)
    full = Attention.of(d, rope=rope, qk_norm="full", qk_norm_eps=d.eps)
    local = replace(full, rope=plain_rope, window=window)
    return decoder(m, d=d, attention=lambda il: local if sliding[il] else full, norms=Norms.POST)


def facts(g: GGUFFile) -> dict[str, str]:
    """Rotary (plain on sliding layers), heads, where the norms sit and the sliding window."""
    d = hp.decoder(g, default_eps=1e-6)
    window, sliding = _sliding(g, d)
    out = decoder_facts(g, default_eps=1e-6, neox=True)
    rope = hp.rope(g, n_head=d.n_head, head_dim=d.head_dim, neox=True)
    if any(sliding) and (rope.freq_scale != 1.0 or rope.yarn_ext_factor):
        out["rotary"] += "; on global layers only (sliding layers: no scaling)"
    out["norms"] = "q and k RMS-normed over the whole projection; after attention and feed-forward only"
    out["sliding window"] = describe(sliding, window)
    return out


FAMILY = Family(name="olmo2", architectures=("olmo2",), build=build, facts=facts)
