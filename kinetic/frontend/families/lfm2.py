"""The lfm2 family: Liquid AI's LFM2 (llama.cpp's src/models/lfm2.cpp).

A hybrid decoder: layers whose `attention.head_count_kv` is 0 are gated short convolutions
(recurrent_blocks.short_conv: a causal conv of `shortconv.l_cache` taps whose per-sequence state is
the last l_cache - 1 rows), the others attention with q and k RMS-normed per head before NeoX rotary
over the whole head, over a sliding window on every attention layer when the file gives
`attention.sliding_window`. Each layer's mixer and SiLU-gated feed-forward are pre-normed
(attn_norm, ffn_norm); the final norm is `token_embd_norm`; the output is tied unless the file has
`output.weight`. MoE files are the lfm2moe architecture (families/lfm2moe.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from kinetic.errors import ModelFileError
from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Blocks
from kinetic.frontend.families.base import Family, rotary_fact
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.recurrent_blocks import hybrid_decoder, kv_heads_per_layer, short_conv

MAX_KERNEL = 64  # shortconv.l_cache: LFM2 files use 3


def _layout(g: GGUFFile):
    n_layer, n_embd, n_head = hp.key(g, "block_count"), hp.key(g, "embedding_length"), hp.key(g, "attention.head_count")
    if n_embd % n_head:
        raise ModelFileError(g.path.name, f"{g.architecture}.attention.head_count", f"is {n_head}",
                             f"a divisor of embedding_length ({n_embd})")
    kernel = hp.key(g, "shortconv.l_cache")
    if not 2 <= kernel <= MAX_KERNEL:
        raise ModelFileError(g.path.name, f"{g.architecture}.shortconv.l_cache", f"is {kernel}",
                             f"between 2 and {MAX_KERNEL}")
    return n_layer, n_head, n_embd // n_head, kv_heads_per_layer(g, n_layer=n_layer, n_head=n_head), kernel


def build(m: Blocks, *, ffn: Callable[[int, int], int] | None = None) -> int:
    """The graph; `ffn(h, layer)` replaces the dense feed-forward (lfm2moe's experts)."""
    n_layer, n_head, head_dim, kv_heads, kernel = _layout(m.gguf)
    eps = float(hp.key(m.gguf, "attention.layer_norm_rms_epsilon"))
    window = int(hp.key(m.gguf, "attention.sliding_window", 0))
    rope = hp.rope(m.gguf, n_head=n_head, head_dim=head_dim, neox=True)
    positions = m.input("positions")

    def mixer(il: int, h: int) -> int:
        if kv_heads[il] == 0:
            return short_conv(m, h, layer=il, kernel=kernel)
        return m.attention(h, layer=il, positions=positions, n_head=n_head, n_kv_head=kv_heads[il],
                           head_dim=head_dim, rope=rope, scale=1.0 / math.sqrt(head_dim), window=window,
                           qk_norm="head", qk_norm_eps=eps)

    return hybrid_decoder(m, n_layer=n_layer, eps=eps, mixer=mixer, output_norm="token_embd_norm.weight", ffn=ffn)


def facts(g: GGUFFile) -> dict[str, str]:
    """Which layers are short convolutions, their kernel, the attention layers' heads and rotary."""
    n_layer, n_head, head_dim, kv_heads, kernel = _layout(g)
    conv = [il for il, kv in enumerate(kv_heads) if kv == 0]
    attn = [il for il, kv in enumerate(kv_heads) if kv]
    kv = sorted({kv_heads[il] for il in attn})
    rope = hp.rope(g, n_head=n_head, head_dim=head_dim, neox=True)
    window = int(hp.key(g, "attention.sliding_window", 0))
    return {
        "mixers": f"{len(conv)} short convolution ({', '.join(map(str, conv)) or 'none'}), "
                  f"{len(attn)} attention ({', '.join(map(str, attn)) or 'none'})",
        "short conv": f"{kernel} taps, a per-sequence state of the last {kernel - 1} rows",
        "attention": f"{n_head} heads x {head_dim}, {'/'.join(map(str, kv)) or 'no'} KV heads, q/k RMS-normed per "
                     f"head" + (f", sliding window {window}" if window else ""),
        "rotary": rotary_fact(rope),
        "norm eps": f"{float(hp.key(g, 'attention.layer_norm_rms_epsilon')):g}",
    }


FAMILY = Family(name="lfm2", architectures=("lfm2",), build=build, facts=facts)
