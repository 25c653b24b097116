"""The llama family: Llama 2/3, Mistral, SmolLM2 and every model built like Llama.

Pre-norm decoder: x += attn(rms_norm(x)); x += ffn_silu(rms_norm(x)); rotary in the interleaved
("normal") layout, on q/k weights that GGUF conversion already permuted for it; output projection
separate or tied to the embedding.
"""

from __future__ import annotations

import math

from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Act, Blocks
from kinetic.frontend.families.base import Family


def build(m: Blocks) -> int:
    g = m.gguf
    n_layer = int(hp.key(g, "block_count"))
    n_embd = int(hp.key(g, "embedding_length"))
    n_head = int(hp.key(g, "attention.head_count"))
    n_kv_head = int(hp.key(g, "attention.head_count_kv", n_head))
    head_dim = int(hp.key(g, "attention.key_length", n_embd // n_head))
    eps = float(hp.key(g, "attention.layer_norm_rms_epsilon", 1e-5))
    rope = hp.rope(g, n_head=n_head, head_dim=head_dim, neox=False)

    positions = m.input("positions")
    x = m.embed("token_embd.weight", m.input("tokens"))  # f32 [T, n_embd]
    for il in range(n_layer):
        h = m.rms_norm(x, f"blk.{il}.attn_norm.weight", eps=eps)
        h = m.attention(h, layer=il, positions=positions, n_head=n_head, n_kv_head=n_kv_head,
                        head_dim=head_dim, rope=rope, scale=1.0 / math.sqrt(head_dim))
        x = m.add(x, h)
        h = m.rms_norm(x, f"blk.{il}.ffn_norm.weight", eps=eps)
        x = m.add(x, m.ffn(h, layer=il, act=Act.SILU))
    return m.head(x, eps=eps)  # f32 [R, n_vocab]


FAMILY = Family(name="llama", architectures=("llama",), build=build)
