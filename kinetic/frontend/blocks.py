"""Shared building blocks that family descriptors assemble layers from.

Owns: turning a family's description of a layer (norms, attention with its flags, gated
feed-forward) into IR nodes, and the bookkeeping that makes loading strict: every tensor a family
asks for must exist (else "tensor X is missing"), every tensor in the file must be asked for (else
"tensor X has no place in family F"), and every tensor's shape must be the one the hyperparameters
and the layer give it (else a ModelFileError naming the tensor, its shape and the expected one):
the embedding is [embedding_length, vocab] and holds every token of the tokenizer, a projection's
rows match its input's width, q/k/v/output match the head counts, the feed-forward tensors agree
with each other and with feed_forward_length, the output projection has a row per embedding row (so
any token it picks can be embedded again). A shape the IR's specs still reject is a ModelFileError
too, never an internal error. Families call these with keyword arguments only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np
from gguf import GGMLQuantizationType

from kinetic.errors import KineticError, ModelFileError
from kinetic.frontend import hparams as hp
from kinetic.frontend.gguf_file import GGUFFile, TensorInfo
from kinetic.frontend.rope_scaling import RopeOverrides
from kinetic.frontend.tokenizer.vocab import check_vocab
from kinetic.ir.graph import GraphBuilder
from kinetic.ir.ops import (
    AttentionAttrs,
    InputAttrs,
    MatmulAttrs,
    Op,
    RmsNormAttrs,
    RopeAttrs,
    ScaleAttrs,
    StateAttrs,
    VerifyError,
)
from kinetic.ir.types import TensorType, param_type


class Act(enum.Enum):
    SILU = "silu"
    GELU = "gelu"


QK_NORMS = ("head", "full")  # Blocks.attention's qk_norm: per head, or over the whole projection


@dataclass(frozen=True)
class Options:
    """Lowering choices that change numerics (see kinetic/ir/numerics/)."""

    activations: str = "q8"  # "q8": ggml's 8-bit activation quantization; "f32": float path
    kv_dtype: str = "f16"
    rope: RopeOverrides = RopeOverrides()  # llama.cpp's --rope-* / --yarn-* settings (rope_scaling.py)
    # the reductions' orders, "ggml" or "fast" (kinetic/ir/orders.py), written by the pass pipeline, not
    # by lowering; None: chosen where the model is loaded (kinetic/numerics_mode.py), else the default
    numerics: str | None = None


@dataclass
class Blocks:
    gguf: GGUFFile
    family: str
    options: Options = field(default_factory=Options)
    b: GraphBuilder = field(default_factory=GraphBuilder)
    used: set[str] = field(default_factory=set)
    n_vocab: int | None = None  # rows of the embedding table, once embed() has read it
    # layer -> (k, v, state) of its attention: what a later layer that shares its KV cache reads (gemma4)
    kv_nodes: dict[int, tuple[int, int, int]] = field(default_factory=dict)

    # -- weights -----------------------------------------------------------------------------------

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def weight(self, name: str, ne: tuple[int | None, ...], why: str) -> int:
        """The tensor as a param node, refused unless its GGUF shape `ne` (row length first) is the
        expected one; None in `ne` accepts any size there (it is checked against the others later)."""
        info = self._checked_tensor(name, ne, why)
        return self.b.param(name, param_type(info.type, info.shape))

    def constant(self, name: str, *, why: str) -> float:
        """The one value of an F32 tensor of shape [1], read now as a number: a per-layer scale that
        llama.cpp multiplies in with ggml_mul, which rounds as a scale by that number does (gemma4's
        layer_output_scale)."""
        info = self._checked_tensor(name, (1,), why)
        value = self.gguf.array(name) if info.type == GGMLQuantizationType.F32 else None
        if value is None or not np.isfinite(value[0]):
            shown = info.type.name if value is None else f"the value {value[0]}"
            raise ModelFileError(self.gguf.path.name, f"tensor {name}", f"holds {shown}", f"one finite F32 ({why})")
        return float(value[0])

    def _checked_tensor(self, name: str, ne: tuple[int | None, ...], why: str) -> TensorInfo:
        """The tensor's entry, marked used, refused unless it exists and has the shape `ne`."""
        info = self.gguf.tensors.get(name)
        if info is None:
            raise KineticError(
                f"tensor {name} is missing from {self.gguf.path.name} (family {self.family})",
                "The file is incomplete or was converted for another architecture; get a complete file.",
            )
        fits = len(info.ne) == len(ne) and all(e is None or d == e for d, e in zip(info.ne, ne, strict=False))
        if not fits:
            shown = ", ".join("any" if e is None else str(e) for e in ne)
            raise ModelFileError(self.gguf.path.name, f"tensor {name}", f"has shape {list(info.ne)}",
                                 f"[{shown}] ({why})")
        if max(info.ne) > hp.MAX_WIDTH:
            raise ModelFileError(self.gguf.path.name, f"tensor {name}", f"has shape {list(info.ne)}",
                                 f"no dimension above {hp.MAX_WIDTH}")
        self.used.add(name)
        return info

    def width(self, x: int) -> int:
        """The row width of an activation f32 [T, width]."""
        return self.b.type_of(x).shape[1]

    def node(self, op: Op, inputs: tuple[int, ...], attrs: object = None, type: TensorType | None = None) -> int:
        """A node whose spec accepts its inputs; a spec that refuses them is the file's fault here,
        since every shape came from it."""
        try:
            return self.b.add(op, inputs, attrs, type)
        except VerifyError as exc:
            raise ModelFileError(self.gguf.path.name, "the tensors and hyperparameters", f"do not fit together "
                                 f"({op.value}: {exc})", "shapes that match the hyperparameters") from None

    def check_all_used(self) -> None:
        for name in self.gguf.tensors:
            if name not in self.used:
                raise KineticError(
                    f"tensor {name} has no place in family {self.family}; tensor {name} is not supported yet",
                    "The file uses a layout this family does not handle; run `kinetic info` and report it.",
                )

    # -- inputs ------------------------------------------------------------------------------------

    def input(self, name: str) -> int:
        return self.node(Op.INPUT, (), InputAttrs(name))

    def embed(self, table: str, tokens: int, *, width: int | None = None) -> int:
        """Rows of the embedding table: [embedding_length (or `width`), vocab], with a row for every
        token the tokenizer can produce and as many as <arch>.vocab_size says when the file says; a
        second table (gemma4's per-layer embeddings) has as many rows as the first."""
        n_embd = width or hp.key(self.gguf, "embedding_length")
        rows = self.n_vocab or hp.key(self.gguf, "vocab_size", None)
        info = self.gguf.tensors.get(table)
        if self.n_vocab is None:
            self.n_vocab = info.ne[-1] if info is not None else None
        param = self.weight(table, (n_embd, rows), f"{'' if width else 'embedding_length '}{n_embd} by the vocabulary")
        self._check_tokenizer_fits(table)
        return self.node(Op.EMBED, (param, tokens))

    def _check_tokenizer_fits(self, table: str) -> None:
        """The tokenizer's values have their types (checked now, at load: the tokenizer itself is
        built on first use), and every token it can produce has a row in the table."""
        n_tokens = check_vocab(self.gguf.metadata, self.gguf.path.name)
        if n_tokens > self.n_vocab:
            raise ModelFileError(self.gguf.path.name, "tokenizer.ggml.tokens", f"has {n_tokens} tokens",
                                 f"at most the {self.n_vocab} rows of {table}, so that every token has a row")

    # -- layers ------------------------------------------------------------------------------------

    def rms_norm(self, x: int, weight: str | None, *, eps: float, group: int = 0) -> int:
        size = group or self.width(x)
        inputs = (x,) if weight is None else (x, self.weight(weight, (size,), "one scale per normalized value"))
        return self.node(Op.RMS_NORM, inputs, RmsNormAttrs(eps, group))

    def linear(self, x: int, weight: str, *, n_out: int | None = None, why: str = "", bias: str | None = None) -> int:
        """x @ weight.T (+ bias on every row); the weight's rows are x's width long, and there are n_out
        of them when given; the bias has one f32 value per output."""
        width = self.width(x)
        param = self.weight(weight, (width, n_out), why or f"rows of the input's width {width}")
        y = self.node(Op.MATMUL, (x, param), MatmulAttrs(self.options.activations))
        if bias is None:
            return y
        n = self.width(y)
        return self.node(Op.ADD_BIAS, (y, self.weight(bias, (n,), f"one value per output of {weight}")))

    def add(self, a: int, b: int) -> int:
        return self.node(Op.ADD, (a, b))

    def scale(self, x: int, factor: float) -> int:
        return self.node(Op.SCALE, (x,), ScaleAttrs(factor))

    def attention(
        self,
        x: int,
        *,
        layer: int,
        positions: int,
        n_head: int,
        n_kv_head: int,
        head_dim: int,
        rope: RopeAttrs | None,
        scale: float,
        window: int = 0,
        qk_norm: str | None = None,
        qk_norm_eps: float | None = None,
        qk_norm_after_rope: bool = False,
        q_prescale: bool = False,
        bias: bool = False,
        v_norm_eps: float | None = None,
        v_from_k: bool = False,
    ) -> int:
        """Self-attention of one layer over its KV cache, output projection included.

        qk_norm: None, "head" (q and k RMS-normed per head: attn_q_norm/attn_k_norm hold head_dim
        values; qwen3, gemma3) or "full" (over the whole projection: n_head*head_dim and
        n_kv_head*head_dim values; olmo2), with qk_norm_eps; before rotary, or after it with
        qk_norm_after_rope (hunyuan-dense).
        q_prescale multiplies q by `scale` after rotary and runs attention with scale 1 (Gemma's
        graph does this; it changes how q rounds to the f16 cache type, so it is kept as written).
        bias: q, k and v each add their bias (attn_q.bias ...) after the projection, as llama.cpp's
        build_qkv does (ggml_add, before rotary).
        v_norm_eps: v is RMS-normed per head without a weight (gemma4's ggml_rms_norm of Vcur).
        v_from_k: the layer has no attn_v; the values are the key projection, before k's norm and
        rotary (gemma4's layers without v_proj).
        """
        p = f"blk.{layer}."
        width, q_width, kv_width = self.width(x), n_head * head_dim, n_kv_head * head_dim

        def bias_of(name: str) -> str | None:
            return p + f"attn_{name}.bias" if bias else None

        q = self.linear(x, p + "attn_q.weight", n_out=q_width, why=f"{width} in, {n_head} heads x {head_dim} out",
                        bias=bias_of("q"))
        kv_why = f"{width} in, {n_kv_head} KV heads x {head_dim} out"
        k = self.linear(x, p + "attn_k.weight", n_out=kv_width, why=kv_why, bias=bias_of("k"))
        v = k if v_from_k else self.linear(x, p + "attn_v.weight", n_out=kv_width, why=kv_why, bias=bias_of("v"))
        if v_norm_eps is not None:
            v = self.rms_norm(v, None, eps=v_norm_eps, group=head_dim)
        if not qk_norm_after_rope:
            q, k = self._qk_norm(q, k, layer=layer, kind=qk_norm, eps=qk_norm_eps, head_dim=head_dim)
        if rope is not None:  # None: no rotary in this layer (exaone4's global layers, NoPE granite)
            if rope.freq_factors:  # read into the attributes by hp.rope: the file's tensor has its place
                self._checked_tensor("rope_freqs.weight", (len(rope.freq_factors),), "rotary frequency factors")
            q = self.node(Op.ROPE, (q, positions), rope)
            k_rope = RopeAttrs(**{**rope.__dict__, "n_head": n_kv_head})
            k = self.node(Op.ROPE, (k, positions), k_rope)
        if qk_norm_after_rope:
            q, k = self._qk_norm(q, k, layer=layer, kind=qk_norm, eps=qk_norm_eps, head_dim=head_dim)
        if q_prescale:
            q, scale = self.scale(q, scale), 1.0
        state = self.node(
            Op.STATE, (), StateAttrs(f"kv.{layer}", layer, n_kv_head, head_dim), TensorType("kv", ())
        )
        attrs = AttentionAttrs(n_head, n_kv_head, head_dim, scale, window, 0.0, self.options.kv_dtype)
        self.kv_nodes[layer] = (k, v, state)
        out = self.node(Op.ATTENTION, (q, k, v, state), attrs)
        return self.linear(out, p + "attn_output.weight", n_out=width, why=f"{q_width} in, the width {width} out")

    def _qk_norm(self, q: int, k: int, *, layer: int, kind: str | None, eps: float | None,
                 head_dim: int) -> tuple[int, int]:
        """q and k RMS-normed as `kind` says (see attention); None leaves them as they are."""
        if kind is None:
            return q, k
        if kind not in QK_NORMS or eps is None:
            raise ValueError(f"qk_norm {kind!r} with eps {eps}: expected one of {QK_NORMS} and an eps")
        group = head_dim if kind == "head" else 0  # 0: the whole row
        p = f"blk.{layer}."
        return (self.rms_norm(q, p + "attn_q_norm.weight", eps=eps, group=group),
                self.rms_norm(k, p + "attn_k_norm.weight", eps=eps, group=group))

    def ffn(self, x: int, *, layer: int, act: Act, n_ff: int | None = None) -> int:
        """Gated feed-forward: down(act(gate(x)) * up(x)), gate and up [width, n_ff], down [n_ff, width];
        n_ff is the file's feed_forward_length unless given (a family that reads it per layer)."""
        p = f"blk.{layer}."
        width, n_ff = self.width(x), n_ff or hp.key(self.gguf, "feed_forward_length", None)
        why = f"{width} in, feed_forward_length {n_ff} out" if n_ff else f"{width} in"
        gate = self.linear(x, p + "ffn_gate.weight", n_out=n_ff, why=why)
        n_ff = self.width(gate)
        up = self.linear(x, p + "ffn_up.weight", n_out=n_ff, why=f"{width} in, {n_ff} out as ffn_gate")
        gate = self.node(Op.SILU if act is Act.SILU else Op.GELU, (gate,))
        return self.linear(self.node(Op.MUL, (gate, up)), p + "ffn_down.weight", n_out=width,
                           why=f"{n_ff} in, the width {width} out")

    def _embedding_file(self) -> bool:
        """A decoder file that names a pooling type is an embedding model (Qwen3-Embedding): its graph
        outputs the final norm's rows, marked as embeddings with causal attention
        (kinetic/frontend/encoder.py's facts). Its output projection, if any, is not used; llama.cpp's
        pooling reads the same rows."""
        pooling = hp.key(self.gguf, "pooling_type", None)
        if pooling is None:
            return False
        names = ("none", "mean", "cls", "last", "rank")  # llama.cpp's pooling types (encoder.POOLINGS)
        self.b.meta.extend([("embedding", "true"), ("pooling", names[pooling]), ("causal", "true")])
        if self.has("output.weight"):
            self.used.add("output.weight")
        from kinetic.frontend.encoder import claim_rank_head  # encoder.py builds on this module

        claim_rank_head(self)  # a decoder reranker's cls.output (Qwen3-Reranker's yes / no rows)
        return True

    def head(self, x: int, *, eps: float, norm: str = "output_norm.weight") -> int:
        """Final norm on the wanted rows, then the output projection (tied to the embedding if absent),
        with a row per embedding row: every token it scores can be fed back."""
        rows = self.node(Op.TAKE_ROWS, (x, self.input("output_rows")))
        y = self.rms_norm(rows, norm, eps=eps)
        if self._embedding_file():  # the normed rows are the output (llama.cpp's t_embd), pooled by the runtime
            return y
        out = "output.weight" if self.has("output.weight") else "token_embd.weight"
        return self.linear(y, out, n_out=self.n_vocab, why=f"{self.width(y)} in, a row per token embedding")
