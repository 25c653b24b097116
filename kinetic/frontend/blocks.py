"""Shared building blocks that family descriptors assemble layers from.

Owns: turning a family's description of a layer (norms, attention with its flags, gated
feed-forward) into IR nodes, and the bookkeeping that makes loading strict: every tensor a family
asks for must exist (else "tensor X is missing"), and every tensor in the file must be asked for
(else "tensor X has no place in family F"). Families call these with keyword arguments only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from kinetic.errors import KineticError
from kinetic.frontend.gguf_file import GGUFFile
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
)
from kinetic.ir.types import TensorType, param_type


class Act(enum.Enum):
    SILU = "silu"
    GELU = "gelu"


@dataclass(frozen=True)
class Options:
    """Lowering choices that change numerics (see kinetic/ir/numerics.py)."""

    activations: str = "q8"  # "q8": ggml's 8-bit activation quantization; "f32": float path
    kv_dtype: str = "f16"


@dataclass
class Blocks:
    gguf: GGUFFile
    family: str
    options: Options = field(default_factory=Options)
    b: GraphBuilder = field(default_factory=GraphBuilder)
    used: set[str] = field(default_factory=set)

    # -- weights -----------------------------------------------------------------------------------

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def weight(self, name: str) -> int:
        info = self.gguf.tensors.get(name)
        if info is None:
            raise KineticError(
                f"tensor {name} is missing from {self.gguf.path.name} (family {self.family})",
                "The file is incomplete or was converted for another architecture; get a complete file.",
            )
        self.used.add(name)
        return self.b.param(name, param_type(info.type, info.shape))

    def check_all_used(self) -> None:
        for name in self.gguf.tensors:
            if name not in self.used:
                raise KineticError(
                    f"tensor {name} has no place in family {self.family}; tensor {name} is not supported yet",
                    "The file uses a layout this family does not handle; run `kinetic info` and report it.",
                )

    # -- inputs ------------------------------------------------------------------------------------

    def input(self, name: str) -> int:
        return self.b.add(Op.INPUT, (), InputAttrs(name))

    def embed(self, table: str, tokens: int) -> int:
        return self.b.add(Op.EMBED, (self.weight(table), tokens))

    # -- layers ------------------------------------------------------------------------------------

    def rms_norm(self, x: int, weight: str | None, *, eps: float, group: int = 0) -> int:
        inputs = (x,) if weight is None else (x, self.weight(weight))
        return self.b.add(Op.RMS_NORM, inputs, RmsNormAttrs(eps, group))

    def linear(self, x: int, weight: str) -> int:
        return self.b.add(Op.MATMUL, (x, self.weight(weight)), MatmulAttrs(self.options.activations))

    def add(self, a: int, b: int) -> int:
        return self.b.add(Op.ADD, (a, b))

    def scale(self, x: int, factor: float) -> int:
        return self.b.add(Op.SCALE, (x,), ScaleAttrs(factor))

    def attention(
        self,
        x: int,
        *,
        layer: int,
        positions: int,
        n_head: int,
        n_kv_head: int,
        head_dim: int,
        rope: RopeAttrs,
        scale: float,
        window: int = 0,
        qk_norm_eps: float | None = None,
        q_prescale: bool = False,
    ) -> int:
        """Self-attention of one layer over its KV cache, output projection included.

        q_prescale multiplies q by `scale` after rotary and runs attention with scale 1 (Gemma's
        graph does this; it changes how q rounds to the f16 cache type, so it is kept as written).
        """
        p = f"blk.{layer}."
        q = self.linear(x, p + "attn_q.weight")
        k = self.linear(x, p + "attn_k.weight")
        v = self.linear(x, p + "attn_v.weight")
        if qk_norm_eps is not None:
            q = self.rms_norm(q, p + "attn_q_norm.weight", eps=qk_norm_eps, group=head_dim)
            k = self.rms_norm(k, p + "attn_k_norm.weight", eps=qk_norm_eps, group=head_dim)
        q = self.b.add(Op.ROPE, (q, positions), rope)
        k_rope = RopeAttrs(**{**rope.__dict__, "n_head": n_kv_head})
        k = self.b.add(Op.ROPE, (k, positions), k_rope)
        if q_prescale:
            q, scale = self.scale(q, scale), 1.0
        state = self.b.add(
            Op.STATE, (), StateAttrs(f"kv.{layer}", layer, n_kv_head, head_dim), TensorType("kv", ())
        )
        attrs = AttentionAttrs(n_head, n_kv_head, head_dim, scale, window, 0.0, self.options.kv_dtype)
        out = self.b.add(Op.ATTENTION, (q, k, v, state), attrs)
        return self.linear(out, p + "attn_output.weight")

    def ffn(self, x: int, *, layer: int, act: Act) -> int:
        """Gated feed-forward: down(act(gate(x)) * up(x))."""
        p = f"blk.{layer}."
        gate = self.linear(x, p + "ffn_gate.weight")
        up = self.linear(x, p + "ffn_up.weight")
        gate = self.b.add(Op.SILU if act is Act.SILU else Op.GELU, (gate,))
        return self.linear(self.b.add(Op.MUL, (gate, up)), p + "ffn_down.weight")

    def head(self, x: int, *, eps: float, norm: str = "output_norm.weight") -> int:
        """Final norm on the wanted rows, then the output projection (tied to the embedding if absent)."""
        rows = self.b.add(Op.TAKE_ROWS, (x, self.input("output_rows")))
        y = self.rms_norm(rows, norm, eps=eps)
        out = "output.weight" if self.has("output.weight") else "token_embd.weight"
        return self.linear(y, out)
