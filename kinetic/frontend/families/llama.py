"""The llama family: Llama 2/3, Mistral, SmolLM2 and every model built like Llama.

Pre-norm decoder: x += attn(rms_norm(x)); x += ffn_silu(rms_norm(x)); rotary in the interleaved
("normal") layout, on q/k weights that GGUF conversion already permuted for it; output projection
separate or tied to the embedding.
"""

from __future__ import annotations

from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Blocks
from kinetic.frontend.families.base import Family
from kinetic.frontend.layers import Attention, decoder


def build(m: Blocks) -> int:
    d = hp.decoder(m.gguf, default_eps=1e-5)
    rope = hp.rope(m.gguf, n_head=d.n_head, head_dim=d.head_dim, neox=False)
    return decoder(m, d=d, attention=Attention.of(d, rope=rope))


FAMILY = Family(name="llama", architectures=("llama",), build=build)
