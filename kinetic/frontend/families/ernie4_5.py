"""The ernie4_5 family: Baidu's ERNIE 4.5 dense models (0.3B).

Follows llama.cpp's src/models/ernie4-5.cpp, which is llama's graph: pre-norm decoder, rotary in
the interleaved ("normal") layout over the whole head, SiLU-gated feed-forward, output projection
separate or tied to the embedding. What differs from llama is only in the file: the head size may
come from attention.key_length, and the eps and rotary base are the file's. llama.cpp loads an
optional attn_output.bias but its graph never adds it; Kinetic refuses such a file by name rather
than run a tensor it would ignore. The MoE variant (ernie4_5-moe) is another architecture.
"""

from __future__ import annotations

from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Blocks
from kinetic.frontend.families.base import Family, decoder_facts
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.layers import Attention, decoder, whole_head_rope


def build(m: Blocks) -> int:
    d = hp.decoder(m.gguf, default_eps=1e-5)
    rope = whole_head_rope(m, d, neox=False)
    return decoder(m, d=d, attention=Attention.of(d, rope=rope))


def facts(g: GGUFFile) -> dict[str, str]:
    """Llama's facts: heads, interleaved rotary, eps (1e-5 unless the file says)."""
    return decoder_facts(g, default_eps=1e-5, neox=False)


FAMILY = Family(name="ernie4_5", architectures=("ernie4_5",), build=build, facts=facts)
