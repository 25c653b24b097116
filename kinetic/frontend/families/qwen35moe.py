"""The qwen35moe family: Qwen3.5 mixture of experts (35B-A3B and larger; llama.cpp's
src/models/qwen35moe.cpp).

qwen35's trunk (Gated DeltaNet and gated attention layers, families/qwen35.py) with every
feed-forward a mixture of experts (moe_blocks): softmax over all experts, the top
`expert_used_count`, renormalized and never scaled, SiLU-gated experts on the fused
`ffn_gate_up_exps` (or separate gate and up stacks), plus the shared expert
(`expert_shared_feed_forward_length` wide, else `feed_forward_length`) gated per row by
sigmoid(`ffn_gate_inp_shexp` . x). A trailing prediction (MTP) block is refused for now: its layer is
a MoE layer too, which the drafter does not read yet.
"""

from __future__ import annotations

from kinetic.errors import ModelFileError
from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Blocks
from kinetic.frontend.families import qwen35
from kinetic.frontend.families.base import Family
from kinetic.frontend.families.qwen3moe import experts_fact
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.moe_blocks import Experts, gated_shared_expert, moe_ffn

ROUTING = dict(gating="softmax", normalize=True, scale=0.0)  # what qwen35moe.cpp passes build_moe_ffn


def build(m: Blocks) -> int:
    g = m.gguf
    if hp.key(g, "nextn_predict_layers", 0):
        raise ModelFileError(g.path.name, f"{g.architecture}.nextn_predict_layers",
                             f"is {hp.key(g, 'nextn_predict_layers')}", "0: qwen35moe prediction blocks are not "
                             "supported yet")
    experts = Experts.of(m, **ROUTING)
    n_ff_shared = hp.key(g, "expert_shared_feed_forward_length", 0) or hp.key(g, "feed_forward_length", None)

    def ffn(h: int, il: int) -> int:
        out = moe_ffn(m, h, layer=il, experts=experts)
        if not m.has(f"blk.{il}.ffn_up_shexp.weight"):
            return out
        return m.add(out, gated_shared_expert(m, h, layer=il, n_ff=n_ff_shared))

    return qwen35.build(m, ffn=ffn)


def facts(g: GGUFFile) -> dict[str, str]:
    """qwen35's facts and the experts."""
    n_ff_shared = hp.key(g, "expert_shared_feed_forward_length", 0)
    shared = f", plus a sigmoid-gated shared expert{f' {n_ff_shared} wide' if n_ff_shared else ''}"
    return qwen35.facts(g) | {"experts": experts_fact(g, gating="softmax, renormalized", shared=shared)}


FAMILY = Family(name="qwen35moe", architectures=("qwen35moe",), build=build, facts=facts)
