"""Renders the CPU's layer norm kernel: f32 rows -> (x - mean) / sqrt(variance + eps) [* weight], bit
for bit kinetic/ir/numerics/layer_norm.py (ggml_compute_forward_norm_f32's order, `mean_var_f64`).

Owns: `render_layer_norm(width, eps, weighted)`, one kernel per row width, eps and whether a weight
follows. Does not own where rows live nor which instruction calls it (lowering.py, the tape's
OP_LAYER_NORM).

    kin_layer_norm_{width}_{eps bits}[_w](x, y, w, n_rows)   x, y, w: addresses (i64); w unused if unweighted

Per row, with n = width (the same instruction sequence for every row, so rows are independent of
how many share a call: batch-invariant):

    total_x = x[0] + x[1] + ...            one float64 chain, in order (each x widened exactly)
    mean    = f32(total_x) / f32(n)        f32
    d[i]    = x[i] - mean                  f32, stored to y
    total   = 0.0 (float64); for each whole chunk of 16: s = d*d (f32, 16 lanes), reduced
              16 -> 8 (hi + lo), 8 -> 4 (hi + lo), then (l0 + l2) + (l1 + l3), all f32, added to
              total in float64; then each tail square d[i]*d[i] (f32) added to total in float64
    scale   = 1 / sqrt(f32(total / n) + eps)    f32 (sqrt correctly rounded)
    y[i]    = d[i] * scale [* w[i]]             f32, two roundings when weighted (no fma)

No fast-math flags anywhere, so LLVM keeps every rounding and the order of every sum. The row's
three passes read x only before they write y at the same index, so y may be x (in place); the
addresses come as i64 (no `noalias`) for that reason.
"""

from __future__ import annotations

import numpy as np

from kinetic.codegen.cpu.llvm_ir import Function, f32_literal, module, reduce_add_16

_V16 = "<16 x float>"
PARAMS = [("i64", "x_addr"), ("i64", "y_addr"), ("i64", "w_addr"), ("i64", "n_rows")]
DECLARATIONS = ["declare float @llvm.sqrt.f32(float)"]


def kernel_name(width: int, eps: float, weighted: bool) -> str:
    bits = int(np.float32(eps).view(np.uint32))
    return f"kin_layer_norm_{width}_{bits:08x}{'_w' if weighted else ''}"


def _float_at(fn: Function, base: str, i: str) -> str:
    """The address of float i of the array at `base` (a ptr)."""
    return fn.gep(base, i, "float")


def _row(fn: Function, x: str, y: str, w: str, width: int, eps: float, weighted: bool) -> None:
    """One row: x, y (and w) are ptrs to its first value."""
    chunks = width // 16

    def sum_x(i: str, c: list[str]) -> list[str]:
        value = fn.load("float", _float_at(fn, x, i), 4)
        return [fn.v(f"fadd double {c[0]}, {fn.v(f'fpext float {value} to double')}")]

    (total_x,) = fn.loop(0, width, [("double", "0.0")], sum_x)
    mean = fn.v(f"fdiv float {fn.v(f'fptrunc double {total_x} to float')}, {f32_literal(float(width))}")
    mean16 = fn.splat_value(16, "float", mean)

    def deviations(c: str, t: list[str]) -> list[str]:
        at = fn.v(f"mul i64 {c}, 16")
        d = fn.v(f"fsub {_V16} {fn.load(_V16, _float_at(fn, x, at), 4)}, {mean16}")
        fn.store(_V16, d, _float_at(fn, y, at), 4)
        chunk = reduce_add_16(fn, fn.v(f"fmul {_V16} {d}, {d}"))
        return [fn.v(f"fadd double {t[0]}, {fn.v(f'fpext float {chunk} to double')}")]

    def tail(i: str, t: list[str]) -> list[str]:
        d = fn.v(f"fsub float {fn.load('float', _float_at(fn, x, i), 4)}, {mean}")
        fn.store("float", d, _float_at(fn, y, i), 4)
        square = fn.v(f"fmul float {d}, {d}")
        return [fn.v(f"fadd double {t[0]}, {fn.v(f'fpext float {square} to double')}")]

    (total,) = fn.loop(0, chunks, [("double", "0.0")], deviations)
    (total,) = fn.loop(chunks * 16, width, [("double", total)], tail)
    variance = fn.v(f"fptrunc double {fn.v(f'fdiv double {total}, {f32_literal(float(width))}')} to float")
    root = fn.v(f"call float @llvm.sqrt.f32(float {fn.v(f'fadd float {variance}, {f32_literal(eps)}')})")
    scale = fn.v(f"fdiv float 1.0, {root}")

    def normalize(i: str, _c: list[str]) -> list[str]:
        at = _float_at(fn, y, i)
        value = fn.v(f"fmul float {fn.load('float', at, 4)}, {scale}")
        if weighted:
            value = fn.v(f"fmul float {value}, {fn.load('float', _float_at(fn, w, i), 4)}")
        fn.store("float", value, at, 4)
        return []

    fn.loop(0, width, [], normalize)


def render_layer_norm(width: int, eps: float, weighted: bool) -> tuple[str, str]:
    """The kernel's module text and its function name (see the module docstring)."""
    eps32 = float(np.float32(eps))
    fn = Function(kernel_name(width, eps32, weighted), PARAMS)
    x0 = fn.v("inttoptr i64 %x_addr to ptr")
    y0 = fn.v("inttoptr i64 %y_addr to ptr")
    w = fn.v("inttoptr i64 %w_addr to ptr")

    def row(r: str, _c: list[str]) -> list[str]:
        at = fn.v(f"mul i64 {r}, {width}")
        _row(fn, _float_at(fn, x0, at), _float_at(fn, y0, at), w, width, eps32, weighted)
        return []

    fn.loop(0, "%n_rows", [], row)
    fn.do("ret void")
    return module([fn], DECLARATIONS), fn.name
