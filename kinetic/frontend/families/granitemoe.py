"""The granitemoe family: IBM Granite 3.x MoE models (granite-3.x-1b-a400m, 3b-a800m) and
GraniteMoeShared files.

llama.cpp builds them with granite's graph (src/models/granite.cpp, build_layer_ffn's MoE branch):
granite's layers and four multipliers, with each feed-forward a mixture of experts (moe_blocks):
softmax over all experts, the top `expert_used_count`, renormalized, never scaled, SiLU-gated experts
on the stacked `ffn_{gate,up,down}_exps` tensors. A file with `expert_shared_feed_forward_length`
above 0 adds an ungated shared expert (`ffn_{gate,up,down}_shexp`) to the experts' sum before the
residual scale.
"""

from __future__ import annotations

from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Blocks
from kinetic.frontend.families import granite
from kinetic.frontend.families.base import Family
from kinetic.frontend.families.qwen3moe import experts_fact
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.moe_blocks import Experts, moe_ffn, shared_expert

ROUTING = dict(gating="softmax", normalize=True, scale=0.0)  # what granite.cpp passes build_moe_ffn


def build(m: Blocks) -> int:
    experts = Experts.of(m, **ROUTING)
    n_ff_shared = hp.key(m.gguf, "expert_shared_feed_forward_length", 0)

    def ffn(h: int, il: int) -> int:
        out = moe_ffn(m, h, layer=il, experts=experts)
        return m.add(out, shared_expert(m, h, layer=il, n_ff=n_ff_shared)) if n_ff_shared else out

    return granite.build(m, ffn=ffn)


def facts(g: GGUFFile) -> dict[str, str]:
    """granite's facts and the experts (and the shared expert)."""
    n_ff_shared = hp.key(g, "expert_shared_feed_forward_length", 0)
    shared = f", plus a shared expert {n_ff_shared} wide" if n_ff_shared else ""
    return granite.facts(g) | {"experts": experts_fact(g, gating="softmax, renormalized", shared=shared)}


FAMILY = Family(name="granitemoe", architectures=("granitemoe",), build=build, facts=facts)
