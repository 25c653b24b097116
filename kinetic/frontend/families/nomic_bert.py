"""The nomic-bert family: nomic-embed-text v1/v1.5 (llama.cpp's src/models/bert.cpp, arch nomic-bert).

What differs from bert: positions are rotary (NeoX halves over the whole head, the file's base), not
a learned table; q, k and v come from one fused projection (attn_qkv, split by columns); no biases in
attention or the feed-forward, which is gated: down(silu(gate(x)) * up(x)). Post-norm layers as
BERT's, with layer norms and biases; token type 0's row added to every token; mean pooling unless the
file says otherwise (kinetic/runtime/embedding.py pools and normalizes).
"""

from __future__ import annotations

from kinetic.frontend import encoder as enc
from kinetic.frontend.blocks import Blocks
from kinetic.frontend.families.base import Family
from kinetic.frontend.gguf_file import GGUFFile


def build(m: Blocks) -> int:
    return enc.build_encoder(m, rotary=True, attention_bias=False, fused_qkv=True, ffn=enc.gated_silu_ffn)


def facts(g: GGUFFile) -> dict[str, str]:
    return enc.encoder_facts(g, rotary=True)


FAMILY = Family(name="nomic-bert", architectures=("nomic-bert",), build=build, facts=facts)
