"""A qwen35 file's prediction block (MTP / nextn layer) as its own small graph, for drafting.

Owns: building the block's graph from the file's `blk.N` tensors (N = block_count -
nextn_predict_layers, the first prediction layer), as llama.cpp's qwen35 `graph_mtp` computes it:

    e = enorm(embed(token))              # nextn.embed_tokens, else the model's token_embd
    h = hnorm(hidden)                    # the trunk's final-norm row of the position before (h_nextn)
    x = eh_proj([e; h])                  # f32 [T, 2 n_embd] -> [T, n_embd]
    x += gated_attention(attn_norm(x))   # one full-attention qwen35 block, its own KV cache (kv.N)
    x += ffn(post_attention_norm(x))
    out = shared_head_norm(x)            # (the model's output_norm when the file has none)
    logits = head(out)                   # nextn.shared_head_head, else the model's output layer

The graph's inputs are the pass's tokens, positions, output rows and `hidden.<n_embd>` (PassRows.hidden,
one trunk row per token); its outputs are "logits" and "hidden" (`out` of the output rows: what the
next drafted row reads as its hidden state, as llama.cpp's MTP chain feeds back its own h_nextn).
Does not own running it, its cache or the drafting (kinetic/runtime/mtp.py), nor the main graph,
which checks and places these tensors (kinetic/frontend/families/qwen35.py).
"""

from __future__ import annotations

from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Act, Blocks, Options
from kinetic.frontend.delta_blocks import gated_attention
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.ir.graph import Graph
from kinetic.ir.ops import Op

ARCHITECTURES = ("qwen35",)  # files whose prediction block this module builds (qwen35moe's has experts)


def prediction_layer(g: GGUFFile) -> int | None:
    """The block index of the file's first prediction layer, None when it has none (or is not qwen35)."""
    if g.architecture not in ARCHITECTURES:
        return None
    n_nextn = hp.key(g, "nextn_predict_layers", 0)
    return hp.key(g, "block_count") - n_nextn if n_nextn else None


def build_prediction_block(g: GGUFFile, options: Options | None = None) -> Graph:
    """The block's verified graph (uncompiled: kinetic/runtime/mtp.py runs the pass pipeline on it)."""
    from kinetic.frontend.families.qwen35 import layout  # the family reads the hyperparameters once

    layer = prediction_layer(g)
    if layer is None:
        raise ValueError(f"{g.path.name} has no qwen35 prediction block")
    d, _, _, _, rope = layout(g)
    m = Blocks(g, "qwen35", options or Options())
    p = f"blk.{layer}."
    table = p + "nextn.embed_tokens.weight" if m.has(p + "nextn.embed_tokens.weight") else "token_embd.weight"
    e = m.rms_norm(m.embed(table, m.input("tokens")), p + "nextn.enorm.weight", eps=d.eps)  # f32 [T, n_embd]
    h = m.rms_norm(m.input(f"hidden.{d.n_embd}"), p + "nextn.hnorm.weight", eps=d.eps)  # f32 [T, n_embd]
    x = m.linear(m.node(Op.CONCAT, (e, h)), p + "nextn.eh_proj.weight", n_out=d.n_embd,
                 why=f"[enorm; hnorm] ({2 * d.n_embd}) in, the width {d.n_embd} out")
    a = gated_attention(m, m.rms_norm(x, p + "attn_norm.weight", eps=d.eps), layer=layer,
                        positions=m.input("positions"), n_head=d.n_head, n_kv_head=d.n_kv_head,
                        head_dim=d.head_dim, rope=rope, eps=d.eps)
    x = m.add(a, x)
    x = m.add(m.ffn(m.rms_norm(x, p + "post_attention_norm.weight", eps=d.eps), layer=layer, act=Act.SILU), x)
    rows = m.node(Op.TAKE_ROWS, (x, m.input("output_rows")))  # f32 [R, n_embd]
    head_norm = p + "nextn.shared_head_norm.weight"
    out = m.rms_norm(rows, head_norm if m.has(head_norm) else "output_norm.weight", eps=d.eps)
    head = next(w for w in (p + "nextn.shared_head_head.weight", "output.weight", "token_embd.weight") if m.has(w))
    logits = m.linear(out, head, n_out=m.n_vocab, why=f"{d.n_embd} in, a row per token embedding")
    m.b.output("logits", logits)  # f32 [R, n_vocab]
    m.b.output("hidden", out)  # f32 [R, n_embd]
    m.b.meta.extend([("family", "qwen35"), ("prediction_block", str(layer))])
    return m.b.build()
