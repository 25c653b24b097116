"""The qwen35 family: Qwen3.5 dense files (llama.cpp's src/models/qwen35.cpp).

A hybrid decoder of `block_count - nextn_predict_layers` trunk layers: Gated DeltaNet layers
(delta_blocks.gated_delta_net: a conv state and an S x S state per value head, per sequence) and,
every `full_attention_interval`-th layer (default 4; or as `attention.recurrent_layers` flags them:
llama.cpp's is_recr), attention with an output
gate (delta_blocks.gated_attention: q and k RMS-normed per head, then rotary). Rotary is llama.cpp's
interleaved multi-section rotary (IMROPE, `rope.dimension_sections`) over `rope.dimension_count`
values of each head; for text every section's position is the token's, so it is NeoX-layout rotary
over those values. Each layer is x += mixer(attn_norm(x)); x += ffn(post_attention_norm(x)). The
trailing prediction (MTP / nextn) block is not part of the logits: its tensors are checked here, and
kinetic/frontend/mtp_block.py builds it as its own graph, the "mtp" drafter of RAD-1
(kinetic/runtime/mtp.py; `kinetic info` says `prediction yes`). Output tied unless `output.weight`.
MoE files are the qwen35moe architecture (not supported here).
"""

from __future__ import annotations

from collections.abc import Callable

from kinetic.errors import ModelFileError
from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Act, Blocks
from kinetic.frontend.delta_blocks import DeltaNet, gated_attention, gated_delta_net
from kinetic.frontend.families.base import Family, attention_fact, rotary_fact
from kinetic.frontend.gguf_file import GGUFFile

NEXTN = ("eh_proj", "enorm", "hnorm", "shared_head_norm")  # a prediction block's own tensors (nextn.*)


def layout(g: GGUFFile):
    """(trunk layers, which are recurrent, prediction layers, the attention's sizes, rotary)."""
    d = hp.decoder(g, default_eps=1e-6)
    n_nextn = hp.key(g, "nextn_predict_layers", 0)
    n_trunk = d.n_layer - n_nextn
    if n_trunk < 1:
        raise ModelFileError(g.path.name, f"{g.architecture}.nextn_predict_layers", f"is {n_nextn}",
                             f"fewer than block_count ({d.n_layer})")
    recurrent = _recurrent_layers(g, n_layer=d.n_layer, n_trunk=n_trunk)
    rope = hp.rope(g, n_head=d.n_head, head_dim=d.head_dim, neox=True)
    _check_sections(g, rope.n_rot)
    return d, n_trunk, recurrent, n_nextn, rope


def _recurrent_layers(g: GGUFFile, *, n_layer: int, n_trunk: int) -> tuple[bool, ...]:
    """Which trunk layers are Gated DeltaNet: `attention.recurrent_layers` (one flag per block, or one
    for all) when the file has it, else every layer but each `full_attention_interval`-th."""
    name = f"{g.architecture}.attention.recurrent_layers"
    raw = g.metadata.get(name)
    if raw is None:
        interval = hp.key(g, "full_attention_interval", 4)
        return tuple((il + 1) % interval != 0 for il in range(n_trunk))
    values = raw.tolist() if hasattr(raw, "tolist") else raw
    values = [values] * n_layer if isinstance(values, (bool, int)) else values
    if not isinstance(values, list) or len(values) != n_layer or any(v not in (0, 1) for v in values):
        raise ModelFileError(g.path.name, name, f"is {values}", f"one flag, or one per block ({n_layer})")
    return tuple(bool(v) for v in values[:n_trunk])


def _check_sections(g: GGUFFile, n_rot: int) -> None:
    """IMROPE gives rotated pair i (sector i % sum) the position of section t, h, w (sector % 3 == 0, 1, 2
    within 3 x that section's size) or else e, which text tokens set to 0. Text rows are plain rotary
    only when no rotated pair falls to e: refused otherwise."""
    name = f"{g.architecture}.rope.dimension_sections"
    raw = g.metadata.get(name)
    sections = [int(v) for v in (raw.tolist() if hasattr(raw, "tolist") else raw or [])]
    if len(sections) < 3 or sum(sections) <= 0 or min(sections) < 0:
        raise ModelFileError(g.path.name, name, f"is {sections}", "4 section sizes (t, h, w, e), not all 0")
    total = sum(sections[:4])
    for pair in range(n_rot // 2):
        sector = pair % total
        if not any(sector % 3 == i and sector < 3 * sections[i] for i in range(3)):
            raise ModelFileError(g.path.name, name, f"is {sections}", f"sections covering every rotated pair "
                                 f"(pair {pair} would take the extra position, which Kinetic does not support)")


def _mark_prediction_block(m: Blocks, *, layer: int, d: hp.Decoder) -> None:
    """The prediction block's tensors, checked by shape and marked as placed (the drafter reads them)."""
    p, n_embd, q_width, kv_width = f"blk.{layer}.", d.n_embd, d.n_head * d.head_dim, d.n_kv_head * d.head_dim
    shapes = {"attn_norm.weight": (n_embd,), "post_attention_norm.weight": (n_embd,),
              "attn_q.weight": (n_embd, 2 * q_width), "attn_k.weight": (n_embd, kv_width),
              "attn_v.weight": (n_embd, kv_width), "attn_output.weight": (q_width, n_embd),
              "attn_q_norm.weight": (d.head_dim,), "attn_k_norm.weight": (d.head_dim,),
              "ffn_gate.weight": (n_embd, None), "ffn_up.weight": (n_embd, None), "ffn_down.weight": (None, n_embd),
              "nextn.eh_proj.weight": (2 * n_embd, n_embd), "nextn.enorm.weight": (n_embd,),
              "nextn.hnorm.weight": (n_embd,), "nextn.shared_head_norm.weight": (n_embd,),
              "nextn.embed_tokens.weight": (n_embd, None), "nextn.shared_head_head.weight": (n_embd, None)}
    optional = ("nextn.shared_head_norm.weight", "nextn.embed_tokens.weight", "nextn.shared_head_head.weight")
    for suffix, ne in shapes.items():
        if suffix not in optional or m.has(p + suffix):
            m._checked_tensor(p + suffix, ne, "the prediction block's, as llama.cpp's qwen35 MTP block")


def build(m: Blocks, *, ffn: Callable[[int, int], int] | None = None) -> int:
    """The graph; `ffn(h, layer)` replaces the dense feed-forward (qwen35moe's experts)."""
    g = m.gguf
    d, n_trunk, recurrent, n_nextn, rope = layout(g)
    dims = DeltaNet.read(g) if any(recurrent) else None
    positions = m.input("positions")
    x = m.embed("token_embd.weight", m.input("tokens"))  # f32 [T, n_embd]
    for il in range(n_trunk):
        p = f"blk.{il}."
        h = m.rms_norm(x, p + "attn_norm.weight", eps=d.eps)
        if recurrent[il]:
            h = gated_delta_net(m, h, layer=il, dims=dims, eps=d.eps)
        else:
            h = gated_attention(m, h, layer=il, positions=positions, n_head=d.n_head, n_kv_head=d.n_kv_head,
                                head_dim=d.head_dim, rope=rope, eps=d.eps)
        x = m.add(h, x)
        h = m.rms_norm(x, p + "post_attention_norm.weight", eps=d.eps)
        x = m.add(ffn(h, il) if ffn else m.ffn(h, layer=il, act=Act.SILU), x)
    for il in range(n_trunk, n_trunk + n_nextn):
        _mark_prediction_block(m, layer=il, d=d)
    if n_nextn and g.architecture == "qwen35":  # the engine hands out the trunk's hidden rows (runtime/mtp.py)
        m.b.meta.append(("prediction_layer", str(n_trunk)))
    return m.head(x, eps=d.eps)  # f32 [R, n_vocab]


def facts(g: GGUFFile) -> dict[str, str]:
    """Which layers are Gated DeltaNet, its sizes, the gated attention, rotary and the prediction block."""
    d, n_trunk, recurrent, n_nextn, rope = layout(g)
    delta = [il for il in range(n_trunk) if recurrent[il]]
    attn = [il for il in range(n_trunk) if not recurrent[il]]
    out = {"mixers": f"{len(delta)} Gated DeltaNet ({', '.join(map(str, delta)) or 'none'}), "
                     f"{len(attn)} gated attention ({', '.join(map(str, attn)) or 'none'})"}
    if delta:
        s = DeltaNet.read(g)
        out["gated deltanet"] = (f"{s.n_k_head} key heads, {s.n_v_head} value heads, state {s.head_dim} x "
                                 f"{s.head_dim} per value head, conv {s.d_conv} taps")
    out["attention"] = attention_fact(d) + ", output gate, q/k RMS-normed per head"
    out["rotary"] = rotary_fact(rope) + " (IMROPE sections, text positions)"
    out["mtp"] = f"{n_nextn} prediction block (blk.{n_trunk}), not in the logits" if n_nextn else "none"
    out["norm eps"] = f"{d.eps:g}"
    return out


FAMILY = Family(name="qwen35", architectures=("qwen35",), build=build, facts=facts)
