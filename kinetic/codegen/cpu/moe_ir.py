"""Renders the CPU's mixture-of-experts row kernels: the router (gate, selection, routing weights)
and the weighted sum, bit for bit kinetic/ir/numerics/moe.py (docs/moe.md).

Owns: `render_gate(n_expert, gating)`, `render_select(n_expert, n_used, biased)`,
`render_weights(n_expert, n_used, normalize, scale)` and `render_sum(n_used, width)`: one kernel
each per shape, all with one signature, called by the tape's OP_ROW_KERNEL on whole rows:

    kin_moe_*(x, b, y, r0, r1)    x, b, y: addresses (i64) of row 0 of the inputs and the output
                                  (b unused where the op has one input); rows r0 .. r1

Does not own where rows live nor which instruction calls a kernel (moe_ops.py), nor the expert
matmuls (moe_step.py runs the generated matmul kernels).

Per row (the same instruction sequence whatever r0 and r1, so a row never depends on the others):

    gate softmax: m = max(x) (first of equal values);  d = x - m (f32);  blocks of 16: ggml_v_expf
                  (fmas on f32 lanes, times 2^n in double, rounded once), each block's 16 values
                  reduced 16 -> 8 -> 4 by halves then (l0 + l2) + (l1 + l3) in f32 and added to a
                  double total; the tail: the C library's expf, each added to the total; then
                  y = e * f32(1.0 / total)
    gate sigmoid: y = 1 / (1 + expf(0 - x)), the C library's expf
    select:       slot j: the highest score (x + bias, one f32 add) among the experts after slot
                  j - 1's in the order (score descending, index ascending): the reference's stable
                  sort, ties to the lower expert; stored as exact f32 integers
    weights:      w_j = probs[ids[j]]; normalize: w_j / max(f32(w_0 + w_1 + ... in double), 2^-14)
                  (the maximum keeps a NaN sum, as numpy's); times f32(scale) unless scale is 0 or 1
    sum:          y[c] = slot_0[c] * w_0 + slot_1[c] * w_1 + ... each product rounded, then added
                  in slot order

No fast-math flags, so LLVM keeps every rounding and the order of every sum. The C library's expf
is called, not evaluated inline: a router row has a few dozen values, so its speed does not matter
and the call is the reference's function by construction.
"""

from __future__ import annotations

import numpy as np

from kinetic.codegen.cpu.llvm_ir import Function, f32_literal, module, reduce_add_16
from kinetic.ir.numerics.moe import WEIGHT_SUM_FLOOR

PARAMS = [("i64", "x_addr"), ("i64", "b_addr"), ("i64", "y_addr"), ("i64", "r0"), ("i64", "r1")]
_V16 = "<16 x float>"
_D16 = "<16 x double>"
_I16 = "<16 x i64>"
EXPF = "declare float @expf(float)"
FMA16 = "declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)"

# ggml_v_expf's constants (vec.h; kinetic/ir/numerics/pointwise.expf_ggml)
_GGML_EXPF = {name: f32_literal(float.fromhex(h)) for name, h in (
    ("r23", "0x1.8p23"), ("log2e", "0x1.715476p+0"), ("ln2_hi", "0x1.62e4p-1"), ("ln2_lo", "0x1.7f7d1cp-20"),
    ("c5", "0x1.0e4020p-7"), ("c4", "0x1.573e2ep-5"), ("c3", "0x1.555e66p-3"), ("c2", "0x1.fffdb6p-2"),
    ("c1", "0x1.ffffecp-1"))}


def _float_at(fn: Function, base: str, i: str | int) -> str:
    return fn.gep(base, i, "float")


def _load(fn: Function, base: str, i: str | int) -> str:
    return fn.load("float", _float_at(fn, base, i), 4)


def _rows(name: str, declarations: list[str], row) -> tuple[str, str]:
    """A kernel over rows r0 .. r1: row(fn, r, x, b, y) writes row r from the base pointers."""
    fn = Function(name, PARAMS)
    x = fn.v("inttoptr i64 %x_addr to ptr")
    b = fn.v("inttoptr i64 %b_addr to ptr")
    y = fn.v("inttoptr i64 %y_addr to ptr")

    def body(r: str, _c: list[str]) -> list[str]:
        row(fn, r, x, b, y)
        return []

    fn.loop("%r0", "%r1", [], body)
    fn.do("ret void")
    return module([fn], declarations), fn.name


def _row_ptr(fn: Function, base: str, r: str, width: int) -> str:
    return _float_at(fn, base, fn.v(f"mul i64 {r}, {width}"))


# ---- the gate ------------------------------------------------------------------------------------

def _fma16(fn: Function, a: str, b: str, c: str) -> str:
    return fn.v(f"call {_V16} @llvm.fma.v16f32({_V16} {a}, {_V16} {b}, {_V16} {c})")


def _expf_ggml16(fn: Function, x: str) -> str:
    """ggml_v_expf on 16 lanes: numerics.expf_ggml's operations, lane by lane."""
    k = {name: f"splat (float {value})" for name, value in _GGML_EXPF.items()}
    z = _fma16(fn, x, k["log2e"], k["r23"])
    n = fn.v(f"fsub {_V16} {z}, {k['r23']}")
    neg_n = fn.v(f"fneg {_V16} {n}")
    b = _fma16(fn, neg_n, k["ln2_lo"], _fma16(fn, neg_n, k["ln2_hi"], x))
    u = fn.v(f"fmul {_V16} {b}, {b}")
    high = _fma16(fn, _fma16(fn, k["c5"], b, k["c4"]), u, _fma16(fn, k["c3"], b, k["c2"]))
    j = _fma16(fn, high, u, _fma16(fn, k["c1"], b, "splat (float 1.0)"))
    low = fn.v(f"fcmp olt {_V16} {n}, splat (float -192.0)")
    high_n = fn.v(f"fcmp ogt {_V16} {n}, splat (float 192.0)")
    clamped = fn.v(f"select <16 x i1> {low}, {_V16} splat (float -192.0), {_V16} {n}")
    clamped = fn.v(f"select <16 x i1> {high_n}, {_V16} splat (float 192.0), {_V16} {clamped}")
    whole = fn.v(f"fptosi {_V16} {clamped} to {_I16}")
    biased = fn.v(f"add {_I16} {whole}, splat (i64 1023)")
    scale = fn.v(f"bitcast {_I16} {fn.v(f'shl {_I16} {biased}, splat (i64 52)')} to {_D16}")  # 2^n, exact
    wide = fn.v(f"fmul {_D16} {fn.v(f'fpext {_V16} {j} to {_D16}')}, {scale}")
    scaled = fn.v(f"fptrunc {_D16} {wide} to {_V16}")  # ldexp(j, n), rounded once
    not_positive = fn.v(f"fcmp ole {_V16} {n}, zeroinitializer")
    inf = "splat (float 0x7FF0000000000000)"
    saturated = fn.v(f"select <16 x i1> {not_positive}, {_V16} zeroinitializer, {_V16} {inf}")
    big = fn.v(f"or <16 x i1> {low}, {high_n}")
    return fn.v(f"select <16 x i1> {big}, {_V16} {saturated}, {_V16} {scaled}")


def _add_double(fn: Function, total: str, value: str) -> str:
    return fn.v(f"fadd double {total}, {fn.v(f'fpext float {value} to double')}")


def _softmax_row(fn: Function, x: str, y: str, n: int) -> None:
    def maximum(i: str, c: list[str]) -> list[str]:
        v = _load(fn, x, i)
        return [fn.v(f"select i1 {fn.v(f'fcmp ogt float {v}, {c[0]}')}, float {v}, float {c[0]}")]

    (m,) = fn.loop(1, n, [("float", _load(fn, x, 0))], maximum)
    m16 = fn.splat_value(16, "float", m)
    blocks = n // 16

    def block(c: str, t: list[str]) -> list[str]:
        at = fn.v(f"mul i64 {c}, 16")
        e = _expf_ggml16(fn, fn.v(f"fsub {_V16} {fn.load(_V16, _float_at(fn, x, at), 4)}, {m16}"))
        fn.store(_V16, e, _float_at(fn, y, at), 4)
        return [_add_double(fn, t[0], reduce_add_16(fn, e))]

    def tail(i: str, t: list[str]) -> list[str]:
        e = fn.v(f"call float @expf(float {fn.v(f'fsub float {_load(fn, x, i)}, {m}')})")
        fn.store("float", e, _float_at(fn, y, i), 4)
        return [_add_double(fn, t[0], e)]

    (total,) = fn.loop(0, blocks, [("double", "0.0")], block)
    (total,) = fn.loop(blocks * 16, n, [("double", total)], tail)
    inverse = fn.v(f"fptrunc double {fn.v(f'fdiv double 1.0, {total}')} to float")

    def scale(i: str, _c: list[str]) -> list[str]:
        at = _float_at(fn, y, i)
        fn.store("float", fn.v(f"fmul float {fn.load('float', at, 4)}, {inverse}"), at, 4)
        return []

    fn.loop(0, n, [], scale)


def _sigmoid_row(fn: Function, x: str, y: str, n: int) -> None:
    def one(i: str, _c: list[str]) -> list[str]:
        e = fn.v(f"call float @expf(float {fn.v(f'fsub float 0.0, {_load(fn, x, i)}')})")
        fn.store("float", fn.v(f"fdiv float 1.0, {fn.v(f'fadd float 1.0, {e}')}"), _float_at(fn, y, i), 4)
        return []

    fn.loop(0, n, [], one)


def render_gate(n_expert: int, gating: str) -> tuple[str, str]:
    """The router's probabilities f32 [rows, n_expert] from its logits (numerics.moe.gate)."""
    if gating not in ("softmax", "sigmoid"):
        raise ValueError(f"no gate kernel for {gating!r}")
    row_fn = _softmax_row if gating == "softmax" else _sigmoid_row

    def row(fn, r, x, b, y):
        row_fn(fn, _row_ptr(fn, x, r, n_expert), _row_ptr(fn, y, r, n_expert), n_expert)

    return _rows(f"kin_moe_gate_{gating}_{n_expert}", [EXPF, FMA16], row)


# ---- the selection -------------------------------------------------------------------------------

def render_select(n_expert: int, n_used: int, biased: bool) -> tuple[str, str]:
    """Each row's n_used experts of highest score, highest first (numerics.moe.top_k on the
    probabilities plus the bias b when `biased`), as f32 integers [rows, n_used]."""

    def row(fn: Function, r: str, x: str, b: str, y: str) -> None:
        xr, yr = _row_ptr(fn, x, r, n_expert), _row_ptr(fn, y, r, n_used)

        def score(i: str) -> str:
            v = _load(fn, xr, i)
            return fn.v(f"fadd float {v}, {_load(fn, b, i)}") if biased else v

        def slot(j: str, prev: list[str]) -> list[str]:
            first = fn.v(f"icmp eq i64 {j}, 0")

            def scan(i: str, c: list[str]) -> list[str]:
                s = score(i)
                # after the previous slot's expert in the order (score descending, index ascending)
                tie_after = fn.v(f"and i1 {fn.v(f'fcmp oeq float {s}, {prev[1]}')}, "
                                 f"{fn.v(f'icmp sgt i64 {i}, {prev[0]}')}")
                below = fn.v(f"fcmp olt float {s}, {prev[1]}")
                after = fn.v(f"or i1 {first}, {fn.v(f'or i1 {below}, {tie_after}')}")
                better = fn.v(f"or i1 {fn.v(f'icmp slt i64 {c[0]}, 0')}, {fn.v(f'fcmp ogt float {s}, {c[1]}')}")
                take = fn.v(f"and i1 {better}, {after}")
                return [fn.v(f"select i1 {take}, i64 {i}, i64 {c[0]}"),
                        fn.v(f"select i1 {take}, float {s}, float {c[1]}")]

            best_i, best_s = fn.loop(0, n_expert, [("i64", "-1"), ("float", "0.0")], scan)
            # no expert after the previous one (NaN scores): expert 0 keeps the ids in range
            best_i = fn.v(f"select i1 {fn.v(f'icmp slt i64 {best_i}, 0')}, i64 0, i64 {best_i}")
            fn.store("float", fn.v(f"sitofp i64 {best_i} to float"), _float_at(fn, yr, j), 4)
            return [best_i, best_s]

        fn.loop(0, n_used, [("i64", "-1"), ("float", "0.0")], slot)

    return _rows(f"kin_moe_select_{n_expert}_{n_used}{'_b' if biased else ''}", [], row)


# ---- the routing weights -------------------------------------------------------------------------

def render_weights(n_expert: int, n_used: int, normalize: bool, scale: float) -> tuple[str, str]:
    """f32 [rows, n_used]: the chosen experts' probabilities (x) by their ids (b), renormalized and
    scaled as numerics.moe.route_weights."""
    scale32 = float(np.float32(scale))
    scaled = scale32 not in (0.0, 1.0)

    def row(fn: Function, r: str, x: str, b: str, y: str) -> None:
        xr, br, yr = _row_ptr(fn, x, r, n_expert), _row_ptr(fn, b, r, n_used), _row_ptr(fn, y, r, n_used)
        ids = [fn.v(f"fptosi float {_load(fn, br, j)} to i64") for j in range(n_used)]
        w = [_load(fn, xr, i) for i in ids]
        if normalize:
            total = "0.0"
            for value in w:
                total = _add_double(fn, total, value)
            t = fn.v(f"fptrunc double {total} to float")
            floor = f32_literal(float(WEIGHT_SUM_FLOOR))
            t = fn.v(f"select i1 {fn.v(f'fcmp uge float {t}, {floor}')}, float {t}, float {floor}")
            w = [fn.v(f"fdiv float {value}, {t}") for value in w]
        if scaled:
            w = [fn.v(f"fmul float {value}, {f32_literal(scale32)}") for value in w]
        for j, value in enumerate(w):
            fn.store("float", value, _float_at(fn, yr, j), 4)

    bits = int(np.float32(scale32).view(np.uint32))
    return _rows(f"kin_moe_weights_{n_expert}_{n_used}_{int(normalize)}_{bits:08x}", [], row)


# ---- the weighted sum ----------------------------------------------------------------------------

def render_sum(n_used: int, width: int) -> tuple[str, str]:
    """f32 [rows, width] from the slots' outputs x f32 [rows, n_used * width] and their weights b
    f32 [rows, n_used] (numerics.moe.weighted_sum)."""

    def row(fn: Function, r: str, x: str, b: str, y: str) -> None:
        xr, yr = _row_ptr(fn, x, r, n_used * width), _row_ptr(fn, y, r, width)
        w = [_load(fn, _row_ptr(fn, b, r, n_used), j) for j in range(n_used)]

        def column(c: str, _c: list[str]) -> list[str]:
            total = fn.v(f"fmul float {_load(fn, xr, c)}, {w[0]}")
            for j in range(1, n_used):
                at = fn.v(f"add i64 {c}, {j * width}")
                total = fn.v(f"fadd float {total}, {fn.v(f'fmul float {_load(fn, xr, at)}, {w[j]}')}")
            fn.store("float", total, _float_at(fn, yr, c), 4)
            return []

        fn.loop(0, width, [], column)

    return _rows(f"kin_moe_sum_{n_used}_{width}", [], row)
