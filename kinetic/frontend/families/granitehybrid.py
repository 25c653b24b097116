"""The granitehybrid family: IBM Granite 4.0 H, dense feed-forward files (llama.cpp's
src/models/granite-hybrid.cpp with build_mamba2_layer of mamba-base.cpp).

A hybrid decoder: layers whose `attention.head_count_kv` is 0 are Mamba-2 mixers
(recurrent_blocks.mamba2: a conv state and a scan state per sequence), the others attention with
rotary in the interleaved layout (none when `rope.scaling.finetuned` is false). Granite's multipliers
apply as in the granite family: embedding rows times `embedding_scale`, each mixer and feed-forward
output times `residual_scale`, attention scores times `attention.scale` (else 1/sqrt(head size)),
logits divided by `logit_scale` (when given). Pre-norms, SiLU feed-forward, output tied unless
`output.weight`. Mixture-of-experts files (Granite 4.0 H Tiny/Small) are refused by tensor name.
"""

from __future__ import annotations

from kinetic.errors import ModelFileError
from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Blocks
from kinetic.frontend.families.base import Family, rotary_fact
from kinetic.frontend.families.granite import Multipliers
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.recurrent_blocks import Mamba2, hybrid_decoder, kv_heads_per_layer, mamba2


def _layout(g: GGUFFile):
    n_layer, n_embd, n_head = hp.key(g, "block_count"), hp.key(g, "embedding_length"), hp.key(g, "attention.head_count")
    if n_embd % n_head:
        raise ModelFileError(g.path.name, f"{g.architecture}.attention.head_count", f"is {n_head}",
                             f"a divisor of embedding_length ({n_embd})")
    head_dim = n_embd // n_head
    rotary = hp.key(g, "rope.scaling.finetuned", True)  # false: no rotary at all
    rope = hp.rope(g, n_head=n_head, head_dim=head_dim, neox=False) if rotary else None
    return n_layer, n_head, head_dim, kv_heads_per_layer(g, n_layer=n_layer, n_head=n_head), rope


def build(m: Blocks) -> int:
    g = m.gguf
    n_layer, n_head, head_dim, kv_heads, rope = _layout(g)
    eps = float(hp.key(g, "attention.layer_norm_rms_epsilon"))
    dims = Mamba2.read(g) if 0 in kv_heads else None
    scales = Multipliers.read(g, logit_required=False)
    positions = m.input("positions")

    def mixer(il: int, h: int) -> int:
        if kv_heads[il] == 0:
            return mamba2(m, h, layer=il, dims=dims, eps=eps)
        return m.attention(h, layer=il, positions=positions, n_head=n_head, n_kv_head=kv_heads[il],
                           head_dim=head_dim, rope=rope, scale=scales.kq_scale(head_dim))

    logits = hybrid_decoder(m, n_layer=n_layer, eps=eps, mixer=mixer, embedding_scale=scales.embedding,
                            residual_scale=scales.residual)
    return scales.divide_logits(m, logits)


def facts(g: GGUFFile) -> dict[str, str]:
    """Which layers are Mamba-2 and their sizes, attention, rotary and the multipliers."""
    n_layer, n_head, head_dim, kv_heads, rope = _layout(g)
    ssm = [il for il, kv in enumerate(kv_heads) if kv == 0]
    attn = [il for il, kv in enumerate(kv_heads) if kv]
    out = {"mixers": f"{len(ssm)} Mamba-2 ({', '.join(map(str, ssm)) or 'none'}), "
                     f"{len(attn)} attention ({', '.join(map(str, attn)) or 'none'})"}
    if ssm:
        d = Mamba2.read(g)
        out["mamba-2"] = (f"{d.n_head} heads x {d.d_inner // d.n_head}, state {d.d_state}, {d.n_group} group, "
                          f"conv {d.d_conv} taps")
    kv = sorted({kv_heads[il] for il in attn})
    out["attention"] = f"{n_head} heads x {head_dim}, {'/'.join(map(str, kv)) or 'no'} KV heads"
    out["rotary"] = rotary_fact(rope) if rope else "none (rope.scaling.finetuned is false)"
    out["multipliers"] = Multipliers.read(g, logit_required=False).fact()
    return out


FAMILY = Family(name="granitehybrid", architectures=("granitehybrid",), build=build, facts=facts)
