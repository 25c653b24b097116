"""Renders what activation rows become before a dot: f32 rows -> Q8_0 / Q8_1 / Q8_K blocks for
quantized weights, or rounded to f16 / bf16 for float weights, bit for bit kinetic/ir/numerics'.

Owns: the kernels that turn activation rows into the int8 blocks a quantized dot reads, and the
rounding pass of the float kernels (`render_round`). Rows are contiguous, so a kernel walks
`n_blocks` blocks (or `n` values) and knows nothing of rows or K:

* q8_0: amax = max |x|; d = f16(amax / 127); q = rint(x * (127 / amax)) (0 when amax is 0).
  Sixteen blocks at a time, one lane each, while 16 remain (`_q8_0_group`), the rest one by one;
  both give the same bits (the note above `_q8_0_group`).
* q8_1: q8_0 plus s = f16(d_unrounded * sum q), written as f32.
* q8_k: blocks of 256; max = the first x of largest magnitude; iscale = -127 / max; q = min(127,
  rint(iscale * x)); d = 1 / iscale (0 when max is 0); plus the sums of each 16 q's as i32, which the
  k-quant dots use for their minimums.

* f16: the nearest f16 (ties to even), kept as f32; bf16: ggml_compute_fp32_to_bf16's bits.

`rint` is round-half-even (the default rounding mode), which is what numpy's `rint` and ggml's
`_mm256_round_ps(_MM_ROUND_NEAREST)` and `nearest_int` do.
"""

from __future__ import annotations

from kinetic.codegen.cpu.llvm_ir import Function, const_vec, module, splat

DECLARATIONS = [
    "declare i32 @llvm.vector.reduce.umax.v32i32(<32 x i32>)",
    "declare <32 x float> @llvm.rint.v32f32(<32 x float>)",
    "declare i32 @llvm.vector.reduce.add.v32i32(<32 x i32>)",
    "declare <256 x float> @llvm.fabs.v256f32(<256 x float>)",
    "declare float @llvm.vector.reduce.fmax.v256f32(<256 x float>)",
    "declare <256 x float> @llvm.rint.v256f32(<256 x float>)",
    "declare i256 @llvm.cttz.i256(i256, i1)",
    "declare i32 @llvm.vector.reduce.add.v16i32(<16 x i32>)",
    "declare <16 x i32> @llvm.umax.v16i32(<16 x i32>, <16 x i32>)",
    "declare <16 x float> @llvm.rint.v16f32(<16 x float>)",
]

PARAMS = [("ptr", "x"), ("ptr", "q"), ("ptr", "d"), ("ptr", "e"), ("i64", "n_blocks")]


def _f16_round(fn: Function, value: str) -> str:
    h = fn.v(f"fptrunc float {value} to half")
    return fn.v(f"fpext half {h} to float")


def _abs_max_bits(fn: Function, x: str) -> str:
    """The bits of max |x| over a <32 x float>, as the unsigned max of the magnitudes' bits: the
    float max for non-NaN values, and a NaN where the block holds one (numpy's max propagates it)."""
    bits = fn.v(f"bitcast <32 x float> {x} to <32 x i32>")
    magnitudes = fn.v(f"and <32 x i32> {bits}, {splat('i32', 0x7FFFFFFF)}")
    return fn.v(f"call i32 @llvm.vector.reduce.umax.v32i32(<32 x i32> {magnitudes})")


def _q8_0_block(fn: Function, i: str, with_sum: bool) -> None:
    x = fn.load("<32 x float>", fn.gep("%x", fn.v(f"mul i64 {i}, 32"), "float"), 4)
    amax = fn.v(f"bitcast i32 {_abs_max_bits(fn, x)} to float")
    d = fn.v(f"fdiv float {amax}, 127.0")
    nonzero = fn.v(f"fcmp une float {amax}, 0.0")
    inv = fn.v(f"select i1 {nonzero}, float {fn.v(f'fdiv float 127.0, {amax}')}, float 0.0")
    scaled = fn.v(f"fmul <32 x float> {x}, {fn.splat_value(32, 'float', inv)}")
    rounded = fn.v(f"call <32 x float> @llvm.rint.v32f32(<32 x float> {scaled})")
    wide = fn.v(f"fptosi <32 x float> {rounded} to <32 x i32>")
    fn.store("<32 x i8>", fn.v(f"trunc <32 x i32> {wide} to <32 x i8>"), fn.gep("%q", fn.v(f"mul i64 {i}, 32")))
    fn.store("float", _f16_round(fn, d), fn.gep("%d", i, "float"), 4)
    if with_sum:  # the sum of q as i32, before the int8 cast (the note above _q8_0_group)
        total = fn.v(f"call i32 @llvm.vector.reduce.add.v32i32(<32 x i32> {wide})")
        s = fn.v(f"fmul float {d}, {fn.v(f'sitofp i32 {total} to float')}")
        fn.store("float", _f16_round(fn, s), fn.gep("%e", i, "float"), 4)


# ---- Q8_0 / Q8_1 sixteen blocks at a time ------------------------------------------------------------
#
# One block at a time, each block's max and sum end in a horizontal reduction and its scales in two
# scalar divisions, a chain the next block cannot overlap much. Sixteen blocks go together: block b's
# two 16-lane halves combined lane by lane, then the 16 blocks' vectors reduced together by
# `_transpose_reduce`, so that lane b of one vector holds block b's amax (or its sum of q); d, the
# inverse scale and s are then one vector operation for the 16 blocks. Each lane does the
# single-block code's operations on the same operands: max and integer sums are exact whatever the
# order, so the bits are the same whichever path a block takes: a row's blocks do not depend on how
# many rows share the call. Both paths add q as i32 before its int8 cast: the stored q's sum wherever
# x * inv is in range, which fails only in blocks holding an inf or a NaN or with 127 / amax inf
# (x86 converts those lanes to 0x80000000, cast to 0), where s is no number worth having in either
# path (tests/codegen/cpu/test_cpu_activation_quant.py holds such blocks). benchmarks/quantize_ab.py:
# the group path takes about 0.6x the one-block code's time, which is itself about half what it took
# before it read amax from integer bits. amax is the unsigned integer max of |x|'s bits in both
# paths (`_abs_max_bits`): the float max for every non-NaN value, and NaN where a block holds one,
# as numpy's max in numerics.quantize_q8_0 gives.

GROUP = 16  # blocks a group: one lane each
_V16I = "<16 x i32>"


def _transpose_reduce(fn: Function, vs: list[str], ty: str, op) -> str:
    """16 vectors <16 x ty> -> one whose lane b is op folded over vector b's 16 lanes (op(fn, a, b)
    lane by lane; exact for max and integer adds, whatever the order). Each level adds the halves of
    pairs of vectors at once: after level one lanes 8c'.. of a vector hold one input's 8 partials,
    then 4, 2, 1, in input order throughout."""
    size = GROUP
    while len(vs) > 1:
        half = size // 2
        lows = [b * size + t for b in range(2 * GROUP // size) for t in range(half)]
        highs = [x + half for x in lows]
        nxt = []
        for a, b in zip(vs[0::2], vs[1::2], strict=True):
            lo = fn.v(f"shufflevector <16 x {ty}> {a}, <16 x {ty}> {b}, {const_vec('i32', lows)}")
            hi = fn.v(f"shufflevector <16 x {ty}> {a}, <16 x {ty}> {b}, {const_vec('i32', highs)}")
            nxt.append(op(fn, lo, hi))
        vs, size = nxt, half
    return vs[0]


def _umax(fn: Function, a: str, b: str) -> str:
    return fn.v(f"call {_V16I} @llvm.umax.v16i32({_V16I} {a}, {_V16I} {b})")


def _add_i32(fn: Function, a: str, b: str) -> str:
    return fn.v(f"add {_V16I} {a}, {b}")


def _q8_0_group(fn: Function, first: str, with_sum: bool) -> list[str]:
    """Blocks first .. first + 15, as _q8_0_block does each (the note above)."""
    halves = []  # block b's two <16 x float>
    for b in range(GROUP):
        at = fn.v(f"mul i64 {fn.v(f'add i64 {first}, {b}')}, 32")
        halves.append([fn.load("<16 x float>", fn.gep("%x", fn.v(f"add i64 {at}, {16 * h}"), "float"), 4)
                       for h in range(2)])

    def magnitudes(x: str) -> str:
        return fn.v(f"and {_V16I} {fn.v(f'bitcast <16 x float> {x} to {_V16I}')}, {splat('i32', 0x7FFFFFFF)}")

    block_max = [_umax(fn, magnitudes(lo), magnitudes(hi)) for lo, hi in halves]  # lane-wise, 16 lanes a block
    amax_bits = _transpose_reduce(fn, block_max, "i32", _umax)
    amax = fn.v(f"bitcast {_V16I} {amax_bits} to <16 x float>")
    c127 = splat("float", "127.0")
    d = fn.v(f"fdiv <16 x float> {amax}, {c127}")
    nonzero = fn.v(f"fcmp une <16 x float> {amax}, zeroinitializer")
    inv = fn.v(f"select <16 x i1> {nonzero}, <16 x float> {fn.v(f'fdiv <16 x float> {c127}, {amax}')}, "
               f"<16 x float> zeroinitializer")
    fn.store("<16 x float>", _f16_round_v16(fn, d), fn.gep("%d", first, "float"), 4)
    sums = []
    for b, pair in enumerate(halves):
        scale = fn.splat_value(16, "float", fn.v(f"extractelement <16 x float> {inv}, i64 {b}"))
        at = fn.v(f"mul i64 {fn.v(f'add i64 {first}, {b}')}, 32")
        wide = []  # q as i32, summed before the int8 cast as _q8_0_block sums them (the note above)
        for h, x in enumerate(pair):
            scaled = fn.v(f"fmul <16 x float> {x}, {scale}")
            rounded = fn.v(f"call <16 x float> @llvm.rint.v16f32(<16 x float> {scaled})")
            wide.append(fn.v(f"fptosi <16 x float> {rounded} to {_V16I}"))
            q = fn.v(f"trunc {_V16I} {wide[-1]} to <16 x i8>")
            fn.store("<16 x i8>", q, fn.gep("%q", fn.v(f"add i64 {at}, {16 * h}")))
        sums.append(_add_i32(fn, *wide))
    if with_sum:
        total = fn.v(f"sitofp {_V16I} {_transpose_reduce(fn, sums, 'i32', _add_i32)} to <16 x float>")
        fn.store("<16 x float>", _f16_round_v16(fn, fn.v(f"fmul <16 x float> {d}, {total}")),
                 fn.gep("%e", first, "float"), 4)
    return []


def _f16_round_v16(fn: Function, v: str) -> str:
    return fn.v(f"fpext <16 x half> {fn.v(f'fptrunc <16 x float> {v} to <16 x half>')} to <16 x float>")


def _signed_max(fn: Function, x: str) -> str:
    """The first element of largest magnitude (numpy's argmax of |x| picks the first)."""
    ax = fn.v(f"call <256 x float> @llvm.fabs.v256f32(<256 x float> {x})")
    amax = fn.v(f"call float @llvm.vector.reduce.fmax.v256f32(<256 x float> {ax})")
    hits = fn.v(f"fcmp oeq <256 x float> {ax}, {fn.splat_value(256, 'float', amax)}")
    first = fn.v(f"call i256 @llvm.cttz.i256(i256 {fn.v(f'bitcast <256 x i1> {hits} to i256')}, i1 false)")
    return fn.v(f"extractelement <256 x float> {x}, i64 {fn.v(f'trunc i256 {first} to i64')}")


def _q8_k_block(fn: Function, i: str) -> None:
    x = fn.load("<256 x float>", fn.gep("%x", fn.v(f"mul i64 {i}, 256"), "float"), 4)
    top = _signed_max(fn, x)
    nonzero = fn.v(f"fcmp une float {top}, 0.0")
    iscale = fn.v(f"select i1 {nonzero}, float {fn.v(f'fdiv float -127.0, {top}')}, float 0.0")
    scaled = fn.v(f"fmul <256 x float> {x}, {fn.splat_value(256, 'float', iscale)}")
    r = fn.v(f"call <256 x float> @llvm.rint.v256f32(<256 x float> {scaled})")
    over = fn.v(f"fcmp ogt <256 x float> {r}, {fn.splat_value(256, 'float', '127.0')}")
    clipped = fn.v(f"select <256 x i1> {over}, <256 x float> {fn.splat_value(256, 'float', '127.0')}, "
                   f"<256 x float> {r}")
    q = fn.v(f"fptosi <256 x float> {clipped} to <256 x i8>")
    fn.store("<256 x i8>", q, fn.gep("%q", fn.v(f"mul i64 {i}, 256")))
    d = fn.v(f"select i1 {nonzero}, float {fn.v(f'fdiv float 1.0, {iscale}')}, float 0.0")
    fn.store("float", d, fn.gep("%d", i, "float"), 4)
    wide = fn.v(f"sext <256 x i8> {q} to <256 x i32>")
    sums = fn.gep("%e", fn.v(f"mul i64 {i}, 16"), "i32")
    for j in range(16):
        lanes = const_vec("i32", range(16 * j, 16 * j + 16))
        part = fn.v(f"shufflevector <256 x i32> {wide}, <256 x i32> poison, {lanes}")
        total = fn.v(f"call i32 @llvm.vector.reduce.add.v16i32(<16 x i32> {part})")
        fn.store("i32", total, fn.gep(sums, j, "i32"), 4)


def render_quantize(fmt: str, *, grouped: bool = True) -> tuple[str, str]:
    """(module IR text, function name) for the activation quantizer of one format; grouped=False
    renders Q8_0 / Q8_1 one block at a time throughout (suffix _single: benchmarks/quantize_ab.py and
    the tests' reference for the grouped path)."""
    grouped = grouped and fmt != "q8_k"
    fn = Function(f"kin_quantize_{fmt}" + ("" if grouped or fmt == "q8_k" else "_single"), PARAMS)
    if fmt == "q8_k":
        body = _q8_k_block
    elif fmt in ("q8_0", "q8_1"):
        def body(f: Function, i: str) -> None:
            _q8_0_block(f, i, fmt == "q8_1")
    else:
        raise ValueError(f"no activation quantizer for {fmt!r}")

    def step(i: str, _carried: list[str]) -> list[str]:
        body(fn, i)
        return []

    first = "0"
    if grouped:
        groups = fn.v(f"udiv i64 %n_blocks, {GROUP}")
        fn.loop(0, groups, [], lambda g, _c: _q8_0_group(fn, fn.v(f"mul i64 {g}, {GROUP}"), fmt == "q8_1"))
        first = fn.v(f"mul i64 {groups}, {GROUP}")
    fn.loop(first, "%n_blocks", [], step)
    fn.do("ret void")
    return module([fn], DECLARATIONS), fn.name


# ---- activation rounding for float weights ----------------------------------------------------------

_V16 = "<16 x float>"
ROUND_PARAMS = [("ptr", "x"), ("ptr", "unused_q"), ("ptr", "unused_d"), ("ptr", "y"), ("i64", "n")]


def _round_f16(fn: Function, v: str, n: int) -> str:
    """<n x float> -> the nearest f16 values (ties to even), as float."""
    return fn.v(f"fpext <{n} x half> {fn.v(f'fptrunc <{n} x float> {v} to <{n} x half>')} to <{n} x float>")


def _round_bf16(fn: Function, v: str, n: int) -> str:
    """<n x float> -> <n x i16> bf16 bits: ggml_compute_fp32_to_bf16, (bits + 0x7fff + lsb) >> 16,
    a NaN kept quiet ((bits >> 16) | 64)."""
    ty = f"<{n} x i32>"
    bits = fn.v(f"bitcast <{n} x float> {v} to {ty}")
    high = fn.v(f"lshr {ty} {bits}, {splat('i32', 16)}")
    lsb = fn.v(f"and {ty} {high}, {splat('i32', 1)}")
    biased = fn.v(f"add {ty} {bits}, {splat('i32', 0x7FFF)}")
    rounded = fn.v(f"lshr {ty} {fn.v(f'add {ty} {biased}, {lsb}')}, {splat('i32', 16)}")
    nan = fn.v(f"fcmp uno <{n} x float> {v}, zeroinitializer")
    quiet = fn.v(f"or {ty} {high}, {splat('i32', 64)}")
    chosen = fn.v(f"select <{n} x i1> {nan}, {ty} {quiet}, {ty} {rounded}")
    return fn.v(f"trunc {ty} {chosen} to <{n} x i16>")


def render_round(fmt: str) -> tuple[str, str]:
    """kin_round_{fmt}(x, _, _, y, n): the n f32 values at x rounded as the dot reads them: "f16" ->
    f16 values as f32 (4 bytes each), "bf16" -> bf16 bit patterns (2 bytes each). The unused
    arguments give it the activation quantizers' signature (the compiled step's OP_QUANT)."""
    if fmt not in ("f16", "bf16"):
        raise ValueError(f"no activation rounding for {fmt!r}")
    fn = Function(f"kin_round_{fmt}", ROUND_PARAMS)

    def store(i: str, v: str, n: int) -> None:
        if fmt == "f16":
            fn.store(f"<{n} x float>", _round_f16(fn, v, n), fn.gep("%y", fn.v(f"mul i64 {i}, 4")), 4)
        else:
            fn.store(f"<{n} x i16>", _round_bf16(fn, v, n), fn.gep("%y", fn.v(f"mul i64 {i}, 2")), 2)

    def block(b: str, _c: list[str]) -> list[str]:
        i = fn.v(f"mul i64 {b}, 16")
        store(i, fn.load(_V16, fn.gep("%x", fn.v(f"mul i64 {i}, 4")), 4), 16)
        return []

    def one(i: str, _c: list[str]) -> list[str]:
        at = fn.gep("%x", fn.v(f"mul i64 {i}, 4"))
        v = fn.v(f"insertelement <1 x float> poison, float {fn.load('float', at, 4)}, i64 0")
        store(i, v, 1)
        return []

    blocks = fn.v("udiv i64 %n, 16")
    fn.loop(0, blocks, [], block)
    fn.loop(fn.v(f"mul i64 {blocks}, 16"), "%n", [], one)
    fn.do("ret void")
    return module([fn], []), fn.name
