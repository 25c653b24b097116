"""The qwen2 family: Qwen2 and Qwen2.5 dense models.

Differences from llama (llama.cpp's src/models/qwen2.cpp): q, k and v each add a bias after their
projection (`add_bias`, before rotary); rotary uses the NeoX layout (halves) over the whole head;
the default rotary base is the file's (Qwen2 uses 1e6). Pre-norm decoder with a SiLU-gated
feed-forward; output projection separate or tied to the embedding.
"""

from __future__ import annotations

from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Blocks
from kinetic.frontend.families.base import Family, decoder_facts
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.layers import Attention, decoder


def build(m: Blocks) -> int:
    d = hp.decoder(m.gguf, default_eps=1e-6)
    rope = hp.rope(m.gguf, n_head=d.n_head, head_dim=d.head_dim, neox=True)
    return decoder(m, d=d, attention=Attention.of(d, rope=rope, bias=True))


def facts(g: GGUFFile) -> dict[str, str]:
    """Heads, NeoX rotary, and the q/k/v biases."""
    return decoder_facts(g, default_eps=1e-6, neox=True) | {"biases": "q, k and v add a bias after the projection"}


FAMILY = Family(name="qwen2", architectures=("qwen2",), build=build, facts=facts)
