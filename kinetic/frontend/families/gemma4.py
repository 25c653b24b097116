"""The gemma4 family: Gemma 4 text models (the dense 31B layout; E2B/E4B's KV sharing and per-layer
embeddings).

Differences from gemma3 (llama.cpp's src/models/gemma4.cpp): the sliding-window layers are the ones
`attention.sliding_window_pattern` marks, not every sixth; sliding and full layers have their own
head size (`key_length_swa` / `key_length`), rotary dimensions and base (`*_swa` keys), and KV head
count (`head_count_kv` may be one per layer); the full layers' rotary divides its angles by the
file's `rope_freqs` factors ("proportional" rotary: a factor of 1e30 leaves a pair unrotated);
v is RMS-normed per head without a weight, and a layer without attn_v takes its values from the key
projection; attention runs with scale 1 (the q/k norms set the scale); each layer's output is
multiplied by its `layer_output_scale` (a one-value tensor, read at load: ggml_mul by it rounds as a
scale does); the logits are soft-capped by `final_logit_softcapping`. The embedding is scaled by
sqrt(width), norms sit before and after both sub-blocks, the feed-forward is GELU-gated, rotary uses
the NeoX layout, as in gemma3.

The last `attention.shared_kv_layers` layers (E2B/E4B) have no keys or values of their own: they
attend over the cache of the last earlier layer of their kind, as llama.cpp's KV reuse does.
Per-layer embeddings (E2B/E4B: `embedding_length_per_layer_input`): each layer adds a gated
projection of its own input, made once from the token's per-layer embedding row and a projection of
the embedding, after its feed-forward (llama.cpp's per_layer_* tensors and `inp_gate`/`proj`/
`post_norm`); feed_forward_length may be one per layer. Refused by name until built: mixture-of-experts
layers (26B-A4B).
"""

from __future__ import annotations

import math

import numpy as np

from kinetic.errors import KineticError
from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Act, Blocks
from kinetic.frontend.families.base import Family, attention_fact, number, rotary_fact
from kinetic.frontend.families.gemma4_layout import Layout, layout
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.windows import describe
from kinetic.ir.ops import AttentionAttrs, ColumnsAttrs, Op, RopeAttrs, SoftcapAttrs


def build(m: Blocks) -> int:
    _refuse_unsupported(m)
    lay = layout(m.gguf)
    eps = lay.eps
    positions, tokens = m.input("positions"), m.input("tokens")
    x = m.embed("token_embd.weight", tokens)
    x = m.scale(x, math.sqrt(hp.key(m.gguf, "embedding_length")))  # f32 [T, n_embd]
    per_layer = _per_layer_inputs(m, x, tokens, lay) if lay.per_layer_width else None  # f32 [T, n_layer * n_pl]
    for il, h in enumerate(lay.heads):
        p = f"blk.{il}."
        a = m.rms_norm(x, p + "attn_norm.weight", eps=eps)
        window = lay.window if lay.sliding[il] else 0
        if lay.kv_source[il] is None:
            a = m.attention(a, layer=il, positions=positions, n_head=h.n_head, n_kv_head=h.n_kv_head,
                            head_dim=h.head_dim, rope=lay.ropes[il], scale=1.0, window=window, qk_norm="head",
                            qk_norm_eps=eps, v_norm_eps=eps, v_from_k=not m.has(p + "attn_v.weight"))
        else:
            a = _shared_kv_attention(m, a, layer=il, source=lay.kv_source[il], heads=h, rope=lay.ropes[il],
                                     window=window, eps=eps, positions=positions)
        x = m.add(m.rms_norm(a, p + "post_attention_norm.weight", eps=eps), x)
        f = m.ffn(m.rms_norm(x, p + "ffn_norm.weight", eps=eps), layer=il, act=Act.GELU, n_ff=lay.n_ff[il])
        x = m.add(m.rms_norm(f, p + "post_ffw_norm.weight", eps=eps), x)
        if per_layer is not None:
            x = _per_layer_block(m, x, per_layer, layer=il, n_pl=lay.per_layer_width, eps=eps)
        if m.has(p + "layer_output_scale.weight"):
            x = m.scale(x, m.constant(p + "layer_output_scale.weight", why="one scale for the layer's output"))
    logits = m.head(x, eps=eps)  # f32 [R, n_vocab]
    return m.node(Op.SOFTCAP, (logits,), SoftcapAttrs(lay.softcap)) if lay.softcap else logits


def facts(g: GGUFFile) -> dict[str, str]:
    """Heads and rotary of the sliding and the full layers, multipliers, norms, window, soft-cap."""
    lay = layout(g)
    kinds = {"sliding": [il for il, s in enumerate(lay.sliding) if s],
             "full": [il for il, s in enumerate(lay.sliding) if not s]}
    out = {"attention": "; ".join(f"{kind} layers: " + ", ".join(sorted({attention_fact(lay.heads[il]) for il in ils}))
                                  for kind, ils in kinds.items() if ils)}
    out["rotary"] = "; ".join(f"{kind} layers: {rotary_fact(lay.ropes[ils[0]])}" for kind, ils in kinds.items() if ils)
    own_kv = [il for il, src in enumerate(lay.kv_source) if src is None]
    shared_v = [str(il) for il in own_kv if f"blk.{il}.attn_v.weight" not in g.tensors]
    out["values"] = "the key projection in layers " + ", ".join(shared_v) if shared_v else "attn_v in every layer"
    if len(own_kv) < len(lay.heads):
        out["KV sharing"] = ", ".join(f"{il} reads {src}'s cache" for il, src in enumerate(lay.kv_source)
                                      if src is not None)
    if lay.per_layer_width:
        out["layer inputs"] = f"{lay.per_layer_width} values a layer from the token, gated in after each feed-forward"
    out["multipliers"] = (f"embedding x sqrt(width) = {math.sqrt(hp.key(g, 'embedding_length')):g}, attention scale 1, "
                          "each layer's output x its layer_output_scale")
    out["norms"] = ("q and k RMS-normed per head, v per head without a weight; before and after attention and "
                    "feed-forward")
    widths = "" if len(set(lay.n_ff)) == 1 else ", widths " + ", ".join(map(str, lay.n_ff))
    out["feed-forward"] = "GELU-gated" + widths
    out["sliding window"] = describe(lay.sliding, lay.window)
    out["logit soft-cap"] = f"{number(lay.softcap)} (cap * tanh(logit / cap))" if lay.softcap else "none"
    out["norm eps"] = f"{lay.eps:g}"
    return out


def _shared_kv_attention(m: Blocks, x: int, *, layer: int, source: int, heads: hp.Heads, rope: RopeAttrs,
                         window: int, eps: float, positions: int) -> int:
    """A KV-sharing layer's attention: its own q (projected, normed per head, rotated) over the keys and
    values layer `source` computed in this pass and cached before it; no k/v projections of its own.
    The attention node names the source's k, v and cache, so its keys are the source's, bit for bit."""
    p, width = f"blk.{layer}.", m.width(x)
    k, v, state = m.kv_nodes[source]
    q = m.linear(x, p + "attn_q.weight", n_out=heads.n_head * heads.head_dim,
                 why=f"{width} in, {heads.n_head} heads x {heads.head_dim} out")
    q = m.node(Op.ROPE, (m.rms_norm(q, p + "attn_q_norm.weight", eps=eps, group=heads.head_dim), positions), rope)
    attrs = AttentionAttrs(heads.n_head, heads.n_kv_head, heads.head_dim, 1.0, window, 0.0, m.options.kv_dtype)
    out = m.node(Op.ATTENTION, (q, k, v, state), attrs)
    return m.linear(out, p + "attn_output.weight", n_out=width, why=f"{m.width(out)} in, the width {width} out")


def _per_layer_inputs(m: Blocks, x: int, tokens: int, lay: Layout) -> int:
    """Each layer's own input, f32 [T, n_layer * n_pl] (layer il's in columns il * n_pl on), as
    llama.cpp's build_inp_per_layer and project_per_layer_inputs make it: the token's row of
    per_layer_token_embd x sqrt(n_pl), plus the scaled embedding x projected by per_layer_model_proj,
    x 1/sqrt(width) and RMS-normed per layer (per_layer_proj_norm); the sum x 1/sqrt(2). Every factor
    is float32 arithmetic, as ggml's."""
    n_pl, n_layer, width = lay.per_layer_width, len(lay.heads), m.width(x)
    table = m.embed("per_layer_token_embd.weight", tokens, width=n_layer * n_pl)
    table = m.scale(table, float(np.sqrt(np.float32(n_pl))))
    proj = m.linear(x, "per_layer_model_proj.weight", n_out=n_layer * n_pl,
                    why=f"{width} in, {n_layer} layers x embedding_length_per_layer_input {n_pl} out")
    proj = m.scale(proj, float(np.float32(1) / np.sqrt(np.float32(width))))
    proj = m.rms_norm(proj, "per_layer_proj_norm.weight", eps=lay.eps, group=n_pl)
    return m.scale(m.add(proj, table), float(np.float32(1) / np.sqrt(np.float32(2))))


def _per_layer_block(m: Blocks, x: int, inputs: int, *, layer: int, n_pl: int, eps: float) -> int:
    """x + post_norm(proj(gelu(inp_gate(x)) * the layer's own input)), after the feed-forward."""
    p, width = f"blk.{layer}.", m.width(x)
    gate = m.node(Op.GELU, (m.linear(x, p + "inp_gate.weight", n_out=n_pl, why=f"{width} in, {n_pl} out"),))
    mine = m.node(Op.COLUMNS, (inputs,), ColumnsAttrs(layer * n_pl, n_pl))  # f32 [T, n_pl]
    y = m.linear(m.node(Op.MUL, (gate, mine)), p + "proj.weight", n_out=width, why=f"{n_pl} in, the width {width} out")
    return m.add(x, m.rms_norm(y, p + "post_norm.weight", eps=eps))


def _refuse_unsupported(m: Blocks) -> None:
    g = m.gguf
    if any(name.endswith(".ffn_gate_inp.weight") for name in g.tensors):
        raise KineticError("gemma4 mixture-of-experts layers are not supported yet",
                           "Gemma 4 26B-A4B uses them; run a dense Gemma 4 model (31B), or use llama.cpp.")


FAMILY = Family(name="gemma4", architectures=("gemma4",), build=build, facts=facts)
