"""Reading a Gemma 4 file's layers: which slide, each one's heads, rotary, feed-forward width, whether
it reads another layer's KV cache, the per-layer input width and the logit cap (llama.cpp's
llama_model_gemma4::load_arch_hparams and its generic hyperparameter loading).

Owns: `Layout` and `layout(gguf)`, every value read through hparams.py and checked together (a
KV-sharing layer's source has its kind and shape; sliding layers' rotary fits their head). Does not
own building the graph (gemma4.py) or the tensors' shapes (blocks.py checks them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kinetic.errors import ModelFileError
from kinetic.frontend import hparams as hp
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.ir.ops import RopeAttrs


@dataclass(frozen=True)
class Layout:
    """The hyperparameters a Gemma 4 file's layers are built from, read and checked once."""

    eps: float
    window: int
    sliding: tuple[bool, ...]  # per layer: a sliding-window layer
    heads: tuple[hp.Heads, ...]
    ropes: tuple[RopeAttrs, ...]
    softcap: float  # 0 = none
    kv_source: tuple[int | None, ...]  # per layer: the earlier layer whose KV cache it reads, or None
    n_ff: tuple[int, ...]  # per layer (the KV-sharing layers of E2B/E4B are twice as wide)
    per_layer_width: int  # values of each layer's own input from the token (0: none)


def layout(g: GGUFFile) -> Layout:
    n_layer = hp.key(g, "block_count")
    sliding = hp.per_layer(g, "attention.sliding_window_pattern", n_layer=n_layer)  # required, as llama.cpp
    heads = _heads(g, n_layer=n_layer, sliding=sliding)
    return Layout(eps=float(hp.key(g, "attention.layer_norm_rms_epsilon", 1e-6)),
                  window=hp.key(g, "attention.sliding_window", 0), sliding=sliding, heads=heads,
                  ropes=_ropes(g, heads=heads, sliding=sliding), softcap=hp.key(g, "final_logit_softcapping", 0.0),
                  kv_source=_kv_sources(g, heads=heads, sliding=sliding),
                  n_ff=hp.per_layer(g, "feed_forward_length", n_layer=n_layer),
                  per_layer_width=hp.key(g, "embedding_length_per_layer_input", 0))


def _heads(g, *, n_layer: int, sliding: tuple[bool, ...]) -> tuple[hp.Heads, ...]:
    """Each layer's heads: the sliding layers' size from key_length_swa, the full layers' from key_length."""
    full_k, full_v = hp.key(g, "attention.key_length"), hp.key(g, "attention.value_length")
    swa_k = hp.key(g, "attention.key_length_swa", full_k)
    swa_v = hp.key(g, "attention.value_length_swa", swa_k)
    return hp.heads_per_layer(g, n_layer=n_layer, key_length=tuple(swa_k if s else full_k for s in sliding),
                              value_length=tuple(swa_v if s else full_v for s in sliding))


def _ropes(g, *, heads: tuple[hp.Heads, ...], sliding: tuple[bool, ...]) -> tuple[RopeAttrs, ...]:
    """Each layer's rotary (NeoX): the full layers' as the file's rotary keys say, rope_freqs factors
    included; the sliding layers' over rope.dimension_count_swa of their own head size, with
    rope.freq_base_swa, no frequency factors and no linear scale (llama.cpp's SWA rules)."""
    full_head_dim = hp.key(g, "attention.key_length")
    full = hp.rope(g, n_head=heads[0].n_head, head_dim=full_head_dim, neox=True)
    swa_head_dim = hp.key(g, "attention.key_length_swa", full_head_dim)
    n_rot = hp.key(g, "rope.dimension_count_swa", swa_head_dim)
    if n_rot % 2 or n_rot > swa_head_dim:
        raise ModelFileError(g.path.name, f"{g.architecture}.rope.dimension_count_swa", f"is {n_rot}",
                             f"an even number from 2 to the sliding layers' head size ({swa_head_dim})")
    local = hp.rope(g, n_head=heads[0].n_head, head_dim=full_head_dim, neox=True, swa=True, freq_factors=False,
                    theta=hp.key(g, "rope.freq_base_swa", full.theta))
    local = dataclasses.replace(local, head_dim=swa_head_dim, n_rot=n_rot)
    return tuple(dataclasses.replace(local if s else full, n_head=h.n_head)
                 for h, s in zip(heads, sliding, strict=True))


def _kv_sources(g, *, heads: tuple[hp.Heads, ...], sliding: tuple[bool, ...]) -> tuple[int | None, ...]:
    """llama.cpp's KV sharing: the last attention.shared_kv_layers layers compute no keys or values and
    read the cache of the last layer of their kind before them (layer n - 2 for a sliding layer, n - 1
    for a full one, n the first sharing layer), which must be of that kind and shape."""
    n_layer, shared = len(heads), hp.key(g, "attention.shared_kv_layers", 0)
    first = n_layer - shared
    if shared and first < 2:
        raise ModelFileError(g.path.name, f"{g.architecture}.attention.shared_kv_layers", f"is {shared}",
                             f"at most {n_layer - 2}: two layers of their own keys and values before the sharing ones")
    sources: list[int | None] = [None] * first
    for il in range(first, n_layer):
        src = first - (2 if sliding[il] else 1)
        if sliding[src] != sliding[il] or (heads[src].n_kv_head, heads[src].head_dim) != \
                (heads[il].n_kv_head, heads[il].head_dim):
            raise ModelFileError(g.path.name, f"{g.architecture}.attention.shared_kv_layers", f"is {shared}",
                                 f"sharing layers whose cache layer has their kind and shape (layer {il} reads {src})")
        sources.append(src)
    return tuple(sources)
