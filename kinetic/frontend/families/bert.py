"""The bert family: BERT encoders as embedding models (llama.cpp's src/models/bert.cpp, arch bert:
bge, MiniLM, all-MiniLM and the like).

Token embeddings plus token type 0's row plus learned absolute positions (position_embd, one row per
position up to context_length), layer-normed (token_embd_norm); each layer: non-causal attention
with q/k/v/output biases, add the layer's input, layer norm (attn_output_norm); then
down(gelu(up(x))) with biases, add, layer norm (layer_output_norm). No rotary. The output is every
token's hidden state; the file's pooling type (mean by default) and L2 normalization are applied by
the runtime (kinetic/runtime/embedding.py). A classification head (cls, cls.output: rerankers) is
read by the runtime too, from the file.
"""

from __future__ import annotations

from kinetic.frontend import encoder as enc
from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Blocks
from kinetic.frontend.families.base import Family
from kinetic.frontend.gguf_file import GGUFFile


def build(m: Blocks) -> int:
    enc.check_non_causal(m)
    d = hp.decoder(m.gguf, default_eps=1e-12)
    eps = float(hp.key(m.gguf, "attention.layer_norm_epsilon"))
    positions = m.input("positions")
    x = enc.input_embeddings(m, n_embd=d.n_embd, positions=positions)
    x = enc.layer_norm(m, x, "token_embd_norm", eps=eps)
    attention = enc.EncoderAttention(n_head=d.n_head, head_dim=d.head_dim, rope=None, bias=True, fused_qkv=False)
    for il in range(d.n_layer):
        p = f"blk.{il}."
        h = enc.attention(m, x, layer=il, positions=positions, a=attention)
        x = enc.layer_norm(m, m.add(h, x), p + "attn_output_norm", eps=eps)
        h = enc.gelu_ffn(m, x, layer=il)
        x = enc.layer_norm(m, m.add(h, x), p + "layer_output_norm", eps=eps)
    enc.mark_embedding(m, pooling=enc.pooling(m, default="mean"), causal=False)
    enc.claim_rank_head(m)
    return enc.output_rows(m, x)


def facts(g: GGUFFile) -> dict[str, str]:
    return enc.encoder_facts(g, rotary=False)


FAMILY = Family(name="bert", architectures=("bert",), build=build, facts=facts)
