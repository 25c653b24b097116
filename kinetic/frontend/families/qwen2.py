"""The qwen2 family: Qwen2 and Qwen2.5 dense models.

Differences from llama (llama.cpp's src/models/qwen2.cpp): q, k and v each add a bias after their
projection (`add_bias`, before rotary); rotary uses the NeoX layout (halves) over the whole head;
the default rotary base is the file's (Qwen2 uses 1e6). Pre-norm decoder with a SiLU-gated
feed-forward; output projection separate or tied to the embedding.
"""

from __future__ import annotations

import math

from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Act, Blocks
from kinetic.frontend.families.base import Family


def build(m: Blocks) -> int:
    d = hp.decoder(m.gguf, default_eps=1e-6)
    rope = hp.rope(m.gguf, n_head=d.n_head, head_dim=d.head_dim, neox=True)

    positions = m.input("positions")
    x = m.embed("token_embd.weight", m.input("tokens"))  # f32 [T, n_embd]
    for il in range(d.n_layer):
        h = m.rms_norm(x, f"blk.{il}.attn_norm.weight", eps=d.eps)
        h = m.attention(h, layer=il, positions=positions, n_head=d.n_head, n_kv_head=d.n_kv_head,
                        head_dim=d.head_dim, rope=rope, scale=1.0 / math.sqrt(d.head_dim), bias=True)
        x = m.add(x, h)
        h = m.rms_norm(x, f"blk.{il}.ffn_norm.weight", eps=d.eps)
        x = m.add(x, m.ffn(h, layer=il, act=Act.SILU))
    return m.head(x, eps=d.eps)  # f32 [R, n_vocab]


FAMILY = Family(name="qwen2", architectures=("qwen2",), build=build)
