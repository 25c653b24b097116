"""The qwen3 family: Qwen3 dense models.

Differences from llama (llama.cpp's src/models/qwen3.cpp): q and k are RMS-normed per head
(attn_q_norm/attn_k_norm, head-size weights) before rotary; the head size is the file's
attention.key_length, independent of the width (q projects to n_head x head size, which may differ
from the width); rotary uses the NeoX layout (halves) over the whole head; eps from the file.
Pre-norm decoder with a SiLU-gated feed-forward; output projection separate or tied to the
embedding. Embedding and reranker files (a pooling_type, a cls.output head) output the final norm's rows
(Blocks.head; kinetic/runtime/embedding.py pools and scores them).
"""

from __future__ import annotations

from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Blocks
from kinetic.frontend.families.base import Family, decoder_facts
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.layers import Attention, decoder, whole_head_rope


def build(m: Blocks) -> int:
    d = hp.decoder(m.gguf, default_eps=1e-6)
    rope = whole_head_rope(m, d, neox=True)
    return decoder(m, d=d, attention=Attention.of(d, rope=rope, qk_norm="head", qk_norm_eps=d.eps))


def facts(g: GGUFFile) -> dict[str, str]:
    """Heads (their width is the file's, not width / heads), NeoX rotary, and the q/k norms."""
    return decoder_facts(g, default_eps=1e-6, neox=True) | {"norms": "q and k RMS-normed per head, before rotary"}


FAMILY = Family(name="qwen3", architectures=("qwen3",), build=build, facts=facts)
