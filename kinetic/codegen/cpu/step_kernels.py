"""The generated kernels a compiled step's tape calls, by address: rendered, JIT-compiled and kept.

Owns: `StepKernels`, one step's cache of kernel addresses by (kind, key): activation quantizers and
roundings (activation_ir), quantized and float matmuls (matmul_ir, float_matmul_ir), attention
scores and softmax (attention_ir) and tiles (attention_tile_ir, in either accumulator's order),
layer norms (layer_norm_ir) and the C library's maps (the libm map of
kinetic/codegen/common/libm.py). The JIT keeps the machine code
alive and caches it on disk (jit.py). Does not own the kernels' IR nor which instructions call them
(lowering.py).
"""

from __future__ import annotations

from kinetic.codegen.common.libm import render_libm_map
from kinetic.codegen.cpu import float_matmul_ir
from kinetic.codegen.cpu.activation_ir import render_quantize, render_round
from kinetic.codegen.cpu.attention_ir import heads_per_call, render_scores, render_softmax
from kinetic.codegen.cpu.attention_tile_ir import render_tile
from kinetic.codegen.cpu.jit import default_jit
from kinetic.codegen.cpu.layer_norm_ir import render_layer_norm
from kinetic.codegen.cpu.matmul_choice import MatmulChoice
from kinetic.codegen.cpu.matmul_ir import ordered_layout, render_matmul
from kinetic.codegen.cpu.target import host


class StepKernels:
    """Kernel addresses by (kind, key), each rendered and compiled on first use."""

    def __init__(self, matmul: MatmulChoice | None = None):
        self.jit = default_jit()
        self.variant = host().best_variant()
        self.matmul_choice = matmul or MatmulChoice()  # tile and wide paths: speed only, the same bits
        self.addresses: dict[tuple, int] = {}

    def quantize(self, fmt: str) -> int:
        """An activation quantizer to `fmt` (q8_0, q8_1, q8_k)."""
        return self._get("quant", (fmt,), lambda: render_quantize(fmt))

    def round(self, fmt: str) -> int:
        """A rounding of activations to what a float matmul reads (f16, bf16)."""
        return self._get("round", (fmt,), lambda: render_round(fmt))

    def matmul(self, wtype, k: int, order: str | None = None) -> int:
        """The quantized matmul for weights of `wtype`, rows k wide, summing in `order` (orders.py's
        name; None or "": the type's ggml order, which also keys the ggml order's name)."""
        choice = self.matmul_choice
        built = ordered_layout(wtype, order).dot_order  # None: the type's ggml order
        key = (wtype, k) if built is None else (wtype, k, built)
        return self._get("mm", key, lambda: render_matmul(wtype, k, self.variant, choice.tile,
                                                         wide=choice.wide(wtype), order=order or None))

    def float_matmul(self, wtype, k: int) -> int:
        """The F16 / BF16 / F32 matmul for weights of `wtype`, rows k wide."""
        features = host()
        variant = float_matmul_ir.best_variant(wtype, features.flags)
        return self._get("fmm", (wtype, k),
                         lambda: float_matmul_ir.render_float_matmul(wtype, k, variant, features.features))

    def layer_norm(self, width: int, eps: float, weighted: bool) -> int:
        """The layer norm of rows `width` wide (times a weight when `weighted`)."""
        return self._get("layer_norm", (width, float(eps), weighted),
                         lambda: render_layer_norm(width, eps, weighted))

    def libm(self, name: str) -> int:
        """The C library's `name` over an array (numerics.rope_cos_sin's values)."""
        return self._get("libm", name, lambda: render_libm_map(name))

    def attention(self, group: int, n_kv_head: int, head_dim: int, softcap: bool,
                  threads: int, accumulator: str = "f16") -> tuple[int, int, int]:
        """The score and softmax kernels and the query heads an item carries ((0, 0, 1): the numba
        path), for passes whose single row must still feed `threads` threads; accumulator "f16" or
        "f32" (attention_ir.ACCUMULATORS)."""
        if head_dim % 64:
            return 0, 0, 1
        heads = heads_per_call(group, n_kv_head, threads)
        scores = self._get("scores", (head_dim, heads), lambda: render_scores(head_dim, heads))
        softmax = self._get("softmax", (head_dim, heads, softcap, accumulator),
                            lambda: render_softmax(head_dim, heads, softcap, accumulator=accumulator))
        return scores, softmax, heads

    def attention_tile(self, head_dim: int, softcap: bool, accumulator: str = "f16") -> int:
        """The prompt tile kernel (0 where the head dim is off the 64 grid): attention_tile_ir's,
        rendered for the order's accumulator (f16 or f32)."""
        if head_dim % 64:
            return 0
        return self._get("attention_tile", (head_dim, softcap, accumulator),
                         lambda: render_tile(head_dim, softcap, accumulator=accumulator))

    def generated(self, key: tuple, render) -> int:
        """A kernel rendered by `render()` ((module text, name)), kept by `key` (moe_ops.py's row
        kernels: key names the renderer and its arguments)."""
        return self._get("generated", key, render)

    def _get(self, kind: str, key, render) -> int:
        if (kind, key) not in self.addresses:
            ir, name = render()
            self.addresses[kind, key] = self.jit.address(ir, name)
        return self.addresses[kind, key]
