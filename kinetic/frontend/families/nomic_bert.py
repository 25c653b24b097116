"""The nomic-bert family: nomic-embed-text v1/v1.5 (llama.cpp's src/models/bert.cpp, arch nomic-bert).

What differs from bert: positions are rotary (NeoX halves over the whole head, the file's base), not
a learned table; q, k and v come from one fused projection (attn_qkv, split by columns); no biases in
attention or the feed-forward, which is gated: down(silu(gate(x)) * up(x)). Post-norm layers as
BERT's, with layer norms and biases; token type 0's row added to every token; mean pooling unless the
file says otherwise (kinetic/runtime/embedding.py pools and normalizes).
"""

from __future__ import annotations

from kinetic.frontend import encoder as enc
from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Act, Blocks
from kinetic.frontend.families.base import Family
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.layers import whole_head_rope


def build(m: Blocks) -> int:
    enc.check_non_causal(m)
    d = hp.decoder(m.gguf, default_eps=1e-12)
    eps = float(hp.key(m.gguf, "attention.layer_norm_epsilon"))
    positions = m.input("positions")
    x = enc.input_embeddings(m, n_embd=d.n_embd, positions=None)
    x = enc.layer_norm(m, x, "token_embd_norm", eps=eps)
    rope = whole_head_rope(m, d, neox=True)
    attention = enc.EncoderAttention(n_head=d.n_head, head_dim=d.head_dim, rope=rope, bias=False, fused_qkv=True)
    for il in range(d.n_layer):
        p = f"blk.{il}."
        h = enc.attention(m, x, layer=il, positions=positions, a=attention)
        x = enc.layer_norm(m, m.add(h, x), p + "attn_output_norm", eps=eps)
        h = m.ffn(x, layer=il, act=Act.SILU)
        x = enc.layer_norm(m, m.add(h, x), p + "layer_output_norm", eps=eps)
    enc.mark_embedding(m, pooling=enc.pooling(m, default="mean"), causal=False)
    enc.claim_rank_head(m)
    return enc.output_rows(m, x)


def facts(g: GGUFFile) -> dict[str, str]:
    return enc.encoder_facts(g, rotary=True)


FAMILY = Family(name="nomic-bert", architectures=("nomic-bert",), build=build, facts=facts)
