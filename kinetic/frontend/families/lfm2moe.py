"""The lfm2moe family: Liquid AI's LFM2 mixture of experts (LFM2-8B-A1B, 24B-A2B).

llama.cpp builds it with lfm2's graph (src/models/lfm2.cpp, its MoE branch): lfm2's short
convolutions and attention layers, the first `leading_dense_block_count` layers (0 when absent) with
lfm2's dense SiLU feed-forward, every later one a mixture of experts (moe_blocks): the file's gate
(`expert_gating_func`, sigmoid in LFM2 files), the per-expert selection bias `exp_probs_b.bias` added
for the choice only, the top `expert_used_count`, their unbiased weights renormalized and never
scaled (llama.cpp's loader does not read `expert_weights_scale` here), SiLU-gated experts on the
stacked `ffn_{gate,up,down}_exps` tensors.
"""

from __future__ import annotations

from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Act, Blocks
from kinetic.frontend.families import lfm2
from kinetic.frontend.families.base import Family
from kinetic.frontend.families.qwen3moe import experts_fact
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.moe_blocks import GATING_FUNCS, Experts, moe_ffn

ROUTING = dict(normalize=True, scale=0.0)  # what lfm2.cpp passes build_moe_ffn; the gate is the file's


def build(m: Blocks) -> int:
    experts = Experts.of(m, **ROUTING)
    n_dense = hp.key(m.gguf, "leading_dense_block_count", 0)

    def ffn(h: int, il: int) -> int:
        if il < n_dense:
            return m.ffn(h, layer=il, act=Act.SILU)
        if not m.has(f"blk.{il}.exp_probs_b.bias"):  # llama.cpp requires it in every MoE layer
            m.weight(f"blk.{il}.exp_probs_b.bias", (experts.n_expert,), "one selection bias per expert")
        return moe_ffn(m, h, layer=il, experts=experts)

    return lfm2.build(m, ffn=ffn)


def facts(g: GGUFFile) -> dict[str, str]:
    """lfm2's facts, the dense layers and the experts."""
    n_dense = hp.key(g, "leading_dense_block_count", 0)
    gating = GATING_FUNCS.get(hp.key(g, "expert_gating_func", 1), "?")
    return lfm2.facts(g) | {
        "experts": experts_fact(g, gating=f"{gating} with a selection bias, renormalized")
        + (f"; the first {n_dense} layer{'s' if n_dense > 1 else ''} dense" if n_dense else ""),
    }


FAMILY = Family(name="lfm2moe", architectures=("lfm2moe",), build=build, facts=facts)
