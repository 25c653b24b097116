"""The qwen3moe family: Qwen3 mixture-of-experts models (Qwen3-30B-A3B, Qwen3-235B-A22B).

Differences from qwen3 (llama.cpp's src/models/qwen3moe.cpp): every layer's feed-forward is a mixture
of experts (moe_blocks.moe_ffn): the router `ffn_gate_inp`, a softmax over all experts, the top
`expert_used_count` of them, their probabilities renormalized to sum to 1 and never scaled (llama.cpp
hard-codes all three; its loader never reads `expert_weights_scale` for qwen3moe), SiLU-gated experts
`expert_feed_forward_length` wide on the stacked `ffn_{gate,up,down}_exps` tensors. Attention as qwen3
(q/k RMS-normed per head before NeoX rotary, the file's head size).
"""

from __future__ import annotations

from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Blocks
from kinetic.frontend.families.base import Family, decoder_facts
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.layers import Attention, decoder, whole_head_rope
from kinetic.frontend.moe_blocks import Experts, moe_ffn

ROUTING = dict(gating="softmax", normalize=True, scale=0.0)  # what qwen3moe.cpp passes build_moe_ffn


def build(m: Blocks) -> int:
    d = hp.decoder(m.gguf, default_eps=1e-6)
    rope = whole_head_rope(m, d, neox=True)
    experts = Experts.of(m, **ROUTING)
    return decoder(m, d=d, attention=Attention.of(d, rope=rope, qk_norm="head", qk_norm_eps=d.eps),
                   ffn=lambda h, il: moe_ffn(m, h, layer=il, experts=experts))


def experts_fact(g: GGUFFile, *, gating: str, shared: str = "") -> str:
    """"4 experts, 2 per token (softmax, renormalized), each 128 wide" and the shared expert if any."""
    width = hp.key(g, "expert_feed_forward_length", None)
    each = f", each {width} wide" if width else ""
    return (f"{hp.key(g, 'expert_count')} experts, {hp.key(g, 'expert_used_count')} per token "
            f"({gating}){each}{shared}")


def facts(g: GGUFFile) -> dict[str, str]:
    """qwen3's facts and the experts."""
    return decoder_facts(g, default_eps=1e-6, neox=True) | {
        "norms": "q and k RMS-normed per head, before rotary",
        "experts": experts_fact(g, gating="softmax, renormalized"),
    }


FAMILY = Family(name="qwen3moe", architectures=("qwen3moe",), build=build, facts=facts)
