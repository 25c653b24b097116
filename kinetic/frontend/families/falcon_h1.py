"""The falcon-h1 family: TII's Falcon-H1 (llama.cpp's src/models/falcon-h1.cpp).

Every layer runs attention and a Mamba-2 mixer side by side on the same normed rows (attn_norm):
x += attention(h) + mamba2(h), the two outputs added first; then x += ffn(ffn_norm(x)), the
feed-forward's norm named `blk.N.ffn_norm` (no `.weight`, as llama.cpp names it). Attention: the
file's heads and head size (`attention.key_length`), NeoX rotary, scores scaled by `attention.scale`
when the file gives one (else 1/sqrt(head size)). Mamba-2: recurrent_blocks.mamba2, its `ssm_norm`
optional. The converter folds Falcon-H1's muP multipliers into the weights, so the graph has none.
Output tied unless `output.weight`. Optional biases (`attn_output.bias`, `ffn_*.bias`) are refused
by tensor name.
"""

from __future__ import annotations

import math

from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Act, Blocks
from kinetic.frontend.families.base import Family, attention_fact, rotary_fact
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.recurrent_blocks import Mamba2, mamba2


def build(m: Blocks) -> int:
    g = m.gguf
    d = hp.decoder(g, default_eps=1e-5)
    dims = Mamba2.read(g)
    rope = hp.rope(g, n_head=d.n_head, head_dim=d.head_dim, neox=True)
    scale = hp.key(g, "attention.scale", 0.0) or 1.0 / math.sqrt(d.head_dim)
    positions = m.input("positions")
    x = m.embed("token_embd.weight", m.input("tokens"))  # f32 [T, n_embd]
    for il in range(d.n_layer):
        h = m.rms_norm(x, f"blk.{il}.attn_norm.weight", eps=d.eps)
        attended = m.attention(h, layer=il, positions=positions, n_head=d.n_head, n_kv_head=d.n_kv_head,
                               head_dim=d.head_dim, rope=rope, scale=scale)
        scanned = mamba2(m, h, layer=il, dims=dims, eps=d.eps, optional_norm=True)
        x = m.add(m.add(attended, scanned), x)
        x = m.add(m.ffn(m.rms_norm(x, f"blk.{il}.ffn_norm", eps=d.eps), layer=il, act=Act.SILU), x)
    return m.head(x, eps=d.eps)  # f32 [R, n_vocab]


def facts(g: GGUFFile) -> dict[str, str]:
    """Both mixers of every layer: attention's heads and rotary, Mamba-2's sizes."""
    d = hp.decoder(g, default_eps=1e-5)
    s = Mamba2.read(g)
    return {
        "mixers": f"attention and Mamba-2 side by side in each of the {d.n_layer} layers",
        "attention": attention_fact(d),
        "rotary": rotary_fact(hp.rope(g, n_head=d.n_head, head_dim=d.head_dim, neox=True)),
        "mamba-2": f"{s.n_head} heads x {s.d_inner // s.n_head}, state {s.d_state}, {s.n_group} group, "
                   f"conv {s.d_conv} taps",
        "norm eps": f"{d.eps:g}",
    }


FAMILY = Family(name="falcon-h1", architectures=("falcon-h1",), build=build, facts=facts)
