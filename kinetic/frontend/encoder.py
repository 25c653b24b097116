"""The BERT-style encoder that embedding models are: token, token-type and position embeddings,
layers of non-causal attention and a feed-forward each followed by a layer norm (post-norm), and the
hidden state of every token as the graph's output.

Owns: the encoder families' graph (`build_encoder`: bert and nomic-bert are its keyword options,
llama.cpp's src/models/bert.cpp) and its shared builders,
`layer_norm` (LLM_NORM: the `layer_norm` op, its weight, then its bias as an add_bias), the pooling
the file asks for (`pooling`, llama.cpp's pooling types), and the graph's embedding facts, written
into its meta for the runtime: `embedding` ("true"), `pooling` (none, mean, cls, last, rank) and
`causal` ("false": the runtime runs every text in one bidirectional pass, kinetic/ir/rows.py). Does
not own pooling itself or normalization (kinetic/runtime/embedding.py does both on the graph's output
rows) or the blocks (blocks.py: linear, ffn, strict tensor checks).

Token types: llama.cpp adds row 0 of `token_types` to every token ("sentence A"); the graph reads it
through the `token_types` input, which the runtime leaves at 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from kinetic.errors import ModelFileError
from kinetic.frontend import hparams as hp
from kinetic.frontend.blocks import Act, Blocks
from kinetic.frontend.layers import whole_head_rope
from kinetic.ir.ops import AttentionAttrs, ColumnsAttrs, LayerNormAttrs, Op, RopeAttrs, StateAttrs
from kinetic.ir.types import TensorType

POOLINGS = ("none", "mean", "cls", "last", "rank")  # llama.cpp's LLAMA_POOLING_TYPE_* 0..4


def pooling(m: Blocks, *, default: str) -> str:
    """The file's `<arch>.pooling_type` as a name (POOLINGS), `default` when it has none."""
    return POOLINGS[hp.key(m.gguf, "pooling_type", POOLINGS.index(default))]


def mark_embedding(m: Blocks, *, pooling: str, causal: bool) -> None:
    """Record in the graph that it is an embedding model, how its rows are pooled and whether its
    attention is causal (the runtime reads these)."""
    m.b.meta.extend([("embedding", "true"), ("pooling", pooling), ("causal", "true" if causal else "false")])


def layer_norm(m: Blocks, x: int, prefix: str, *, eps: float) -> int:
    """LLM_NORM: (x - mean) / sqrt(var + eps) * `prefix`.weight + `prefix`.bias (the bias when present)."""
    width = m.width(x)
    weight = m.weight(prefix + ".weight", (width,), "one scale per normalized value")
    y = m.node(Op.LAYER_NORM, (x, weight), LayerNormAttrs(eps))
    if not m.has(prefix + ".bias"):
        return y
    return m.node(Op.ADD_BIAS, (y, m.weight(prefix + ".bias", (width,), "one offset per normalized value")))


def input_embeddings(m: Blocks, *, n_embd: int, positions: int | None) -> int:
    """token_embd rows, plus token_types' row for type 0 when the file has the table, plus
    position_embd rows when `positions` is given (learned absolute positions): f32 [T, n_embd]."""
    x = m.embed("token_embd.weight", m.input("tokens"))
    if m.has("token_types.weight"):
        types = m.weight("token_types.weight", (n_embd, None), "embedding_length by the token types")
        x = m.add(x, m.node(Op.EMBED, (types, m.input("token_types"))))
    if positions is not None:
        n_ctx = hp.key(m.gguf, "context_length")
        table = m.weight("position_embd.weight", (n_embd, n_ctx), "embedding_length by context_length")
        x = m.add(x, m.node(Op.EMBED, (table, positions)))
    return x


@dataclass(frozen=True)
class EncoderAttention:
    """One encoder layer's attention: heads (keys and values have as many), rotary or none, biases."""

    n_head: int
    head_dim: int
    rope: RopeAttrs | None
    bias: bool  # attn_q/k/v.bias and attn_output.bias (BERT); nomic-bert has none
    fused_qkv: bool  # one attn_qkv projection split in three (nomic-bert)


def attention(m: Blocks, x: int, *, layer: int, positions: int, a: EncoderAttention) -> int:
    """Non-causal self-attention of one layer (the pass decides who sees whom), output projection
    included: f32 [T, n_embd] in and out."""
    p, width, q_width = f"blk.{layer}.", m.width(x), a.n_head * a.head_dim
    why = f"{width} in, {a.n_head} heads x {a.head_dim} out"
    if a.fused_qkv:
        qkv = m.linear(x, p + "attn_qkv.weight", n_out=3 * q_width, why=f"{width} in, q, k and v of {q_width}",
                       bias=p + "attn_qkv.bias" if m.has(p + "attn_qkv.bias") else None)
        q, k, v = (m.node(Op.COLUMNS, (qkv,), ColumnsAttrs(i * q_width, q_width)) for i in range(3))
    else:
        q, k, v = (m.linear(x, p + f"attn_{n}.weight", n_out=q_width, why=why,
                            bias=p + f"attn_{n}.bias" if a.bias else None) for n in "qkv")
    if a.rope is not None:
        q, k = (m.node(Op.ROPE, (t, positions), a.rope) for t in (q, k))
    state = m.node(Op.STATE, (), StateAttrs(f"kv.{layer}", layer, a.n_head, a.head_dim), TensorType("kv", ()))
    attrs = AttentionAttrs(a.n_head, a.n_head, a.head_dim, 1.0 / math.sqrt(a.head_dim), 0, 0.0,
                           m.options.kv_dtype)
    out = m.node(Op.ATTENTION, (q, k, v, state), attrs)
    return m.linear(out, p + "attn_output.weight", n_out=width, why=f"{q_width} in, the width {width} out",
                    bias=p + "attn_output.bias" if a.bias else None)


def gelu_ffn(m: Blocks, x: int, *, layer: int) -> int:
    """BERT's feed-forward: down(gelu(up(x) + up_bias)) + down_bias (the biases when present)."""
    p, width = f"blk.{layer}.", m.width(x)
    n_ff = hp.key(m.gguf, "feed_forward_length")

    def bias(name: str) -> str | None:
        return p + name + ".bias" if m.has(p + name + ".bias") else None

    up = m.linear(x, p + "ffn_up.weight", n_out=n_ff, why=f"{width} in, feed_forward_length {n_ff} out",
                  bias=bias("ffn_up"))
    return m.linear(m.node(Op.GELU, (up,)), p + "ffn_down.weight", n_out=width,
                    why=f"{n_ff} in, the width {width} out", bias=bias("ffn_down"))


def gated_silu_ffn(m: Blocks, x: int, *, layer: int) -> int:
    """nomic-bert's feed-forward: down(silu(gate(x)) * up(x)), no biases."""
    return m.ffn(x, layer=layer, act=Act.SILU)


def build_encoder(m: Blocks, *, rotary: bool, attention_bias: bool, fused_qkv: bool,
                  ffn: Callable[..., int]) -> int:
    """The encoder graph: embeddings (learned absolute positions unless `rotary`: NeoX over whole heads),
    layer-normed; per layer non-causal attention, add the layer's input, layer norm (attn_output_norm),
    then `ffn(m, x, layer=il)`, add, layer norm (layer_output_norm); every token's hidden state out,
    the embedding facts and a reranker's head recorded. Returns the output node: f32 [R, n_embd]."""
    check_non_causal(m)
    d = hp.decoder(m.gguf, default_eps=1e-12)
    eps = float(hp.key(m.gguf, "attention.layer_norm_epsilon"))
    positions = m.input("positions")
    x = input_embeddings(m, n_embd=d.n_embd, positions=None if rotary else positions)
    x = layer_norm(m, x, "token_embd_norm", eps=eps)
    rope = whole_head_rope(m, d, neox=True) if rotary else None
    a = EncoderAttention(n_head=d.n_head, head_dim=d.head_dim, rope=rope, bias=attention_bias, fused_qkv=fused_qkv)
    for il in range(d.n_layer):
        p = f"blk.{il}."
        h = attention(m, x, layer=il, positions=positions, a=a)
        x = layer_norm(m, m.add(h, x), p + "attn_output_norm", eps=eps)
        h = ffn(m, x, layer=il)
        x = layer_norm(m, m.add(h, x), p + "layer_output_norm", eps=eps)
    mark_embedding(m, pooling=pooling(m, default="mean"), causal=False)
    claim_rank_head(m)
    return output_rows(m, x)


def check_non_causal(m: Blocks) -> None:
    """Encoder families are non-causal; a file that says its attention is causal is refused by name."""
    if hp.key(m.gguf, "attention.causal", False):
        raise ModelFileError(m.gguf.path.name, f"{m.gguf.architecture}.attention.causal", "is true",
                             f"false: family {m.family} is a non-causal encoder")


def output_rows(m: Blocks, x: int) -> int:
    """The hidden states of the rows the pass wants (every row of an embedding pass): f32 [R, n_embd]."""
    return m.node(Op.TAKE_ROWS, (x, m.input("output_rows")))


def claim_rank_head(m: Blocks) -> None:
    """A reranker's classification head (cls: a dense layer and tanh; cls.output: the scores), checked
    against the width and placed: the runtime applies it to the pooled row (kinetic/runtime/embedding.py)."""
    n_embd = hp.key(m.gguf, "embedding_length")
    if m.has("cls.weight"):
        m.weight("cls.weight", (n_embd, n_embd), "the width in and out")
        if m.has("cls.bias"):
            m.weight("cls.bias", (n_embd,), "one value per output of cls.weight")
    if m.has("cls.output.weight"):  # [n_embd] for one score (GGUF drops a trailing 1), else [n_embd, n_out]
        ne = m.gguf.tensors["cls.output.weight"].ne
        n_out = ne[1] if len(ne) == 2 else 1
        m.weight("cls.output.weight", (n_embd, n_out) if len(ne) == 2 else (n_embd,), "the width in, a row per score")
        if m.has("cls.output.bias"):
            m.weight("cls.output.bias", (n_out,), "one value per output of cls.output.weight")


def encoder_facts(g, *, rotary: bool) -> dict[str, str]:
    """What `kinetic info` says about an encoder file: heads, rotary (or learned positions), pooling,
    norm eps."""
    from kinetic.frontend.families.base import rotary_fact  # base imports blocks, as this module does

    d = hp.decoder(g, default_eps=1e-12)
    rope = hp.rope(g, n_head=d.n_head, head_dim=d.head_dim, neox=True) if rotary else None
    positions = rotary_fact(rope) if rotary else "none: learned absolute positions (position_embd)"
    pool = POOLINGS[hp.key(g, "pooling_type", 1)]
    return {"attention": f"{d.n_head} heads x {d.head_dim}, non-causal", "rotary": positions,
            "pooling": pool, "norm eps": f"{hp.key(g, 'attention.layer_norm_epsilon'):g}"}
