"""The exaone4 family: LG EXAONE 4.0 dense models.

Differences from llama (llama.cpp's src/models/exaone4.cpp): no norm before attention or the
feed-forward; each sub-block's output is RMS-normed (post_attention_norm, post_ffw_norm) before
joining the residual stream; q and k are RMS-normed per head before rotary, which uses the NeoX
layout over the whole head. Sliding windows follow llama.cpp's rule (src/llama-model.cpp): only a
64-layer file (the 32B model) uses them, whatever else the file says; its window is
`attention.sliding_window` (4096 when absent) on the layers the pattern marks (the file's
per-layer booleans, else every 4th layer global), and its global layers have no rotary at all.
Output projection separate or tied to the embedding.
"""

from __future__ import annotations

from dataclasses import replace

from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Blocks
from kinetic.frontend.families.base import Family, decoder_facts
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.layers import Attention, Norms, decoder, whole_head_rope
from kinetic.frontend.windows import describe, sliding_layers

SWA_LAYER_COUNT = 64  # llama.cpp turns sliding windows on for exaone4 files of exactly this many layers
SWA_WINDOW = 4096  # ... with this window unless the file gives one
SWA_PERIOD = 4  # ... and this default pattern: layer il % 4 == 3 is global


def _sliding(g: GGUFFile, d: hp.Decoder) -> tuple[int, tuple[bool, ...]]:
    """The window and which layers use it (none unless the model has SWA_LAYER_COUNT layers)."""
    if d.n_layer != SWA_LAYER_COUNT:
        return 0, (False,) * d.n_layer
    window = int(hp.key(g, "attention.sliding_window", SWA_WINDOW))
    return window, sliding_layers(g, n_layer=d.n_layer, default_period=SWA_PERIOD)


def build(m: Blocks) -> int:
    d = hp.decoder(m.gguf, default_eps=1e-5)
    window, sliding = _sliding(m.gguf, d)
    full = Attention.of(d, rope=whole_head_rope(m, d, neox=True), qk_norm="head", qk_norm_eps=d.eps)
    if not any(sliding):
        return decoder(m, d=d, attention=full, norms=Norms.POST)
    local, unrotated = replace(full, window=window), replace(full, rope=None)
    return decoder(m, d=d, attention=lambda il: local if sliding[il] else unrotated, norms=Norms.POST)


def facts(g: GGUFFile) -> dict[str, str]:
    """Rotary, heads, where the norms sit and the sliding window (with the global layers' no-rotary)."""
    d = hp.decoder(g, default_eps=1e-5)
    window, sliding = _sliding(g, d)
    out = decoder_facts(g, default_eps=1e-5, neox=True)
    out["norms"] = "q and k RMS-normed per head; after attention and feed-forward only"
    out["sliding window"] = describe(sliding, window)
    if any(sliding):
        out["rotary"] += "; sliding layers only (global layers have none)"
    elif window == 0 and hp.key(g, "attention.sliding_window", 0):
        out["sliding window"] += f" (the file's window is used by llama.cpp only with {SWA_LAYER_COUNT} layers)"
    return out


FAMILY = Family(name="exaone4", architectures=("exaone4",), build=build, facts=facts)
