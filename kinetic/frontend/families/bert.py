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
from kinetic.frontend.blocks import Blocks
from kinetic.frontend.families.base import Family
from kinetic.frontend.gguf_file import GGUFFile


def build(m: Blocks) -> int:
    return enc.build_encoder(m, rotary=False, attention_bias=True, fused_qkv=False, ffn=enc.gelu_ffn)


def facts(g: GGUFFile) -> dict[str, str]:
    return enc.encoder_facts(g, rotary=False)


FAMILY = Family(name="bert", architectures=("bert",), build=build, facts=facts)
