"""Renders what activation rows become before a dot: f32 rows -> Q8_0 / Q8_1 / Q8_K blocks for
quantized weights, or rounded to f16 / bf16 for float weights, bit for bit kinetic/ir/numerics'.

Owns: the kernels that turn activation rows into the int8 blocks a quantized dot reads, and the
rounding pass of the float kernels (`render_round`). Rows are contiguous, so a kernel walks
`n_blocks` blocks (or `n` values) and knows nothing of rows or K:

* q8_0: amax = max |x|; d = f16(amax / 127); q = rint(x * (127 / amax)) (0 when amax is 0).
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
    "declare <32 x float> @llvm.fabs.v32f32(<32 x float>)",
    "declare float @llvm.vector.reduce.fmax.v32f32(<32 x float>)",
    "declare <32 x float> @llvm.rint.v32f32(<32 x float>)",
    "declare i32 @llvm.vector.reduce.add.v32i32(<32 x i32>)",
    "declare <256 x float> @llvm.fabs.v256f32(<256 x float>)",
    "declare float @llvm.vector.reduce.fmax.v256f32(<256 x float>)",
    "declare <256 x float> @llvm.rint.v256f32(<256 x float>)",
    "declare i256 @llvm.cttz.i256(i256, i1)",
    "declare i32 @llvm.vector.reduce.add.v16i32(<16 x i32>)",
]

PARAMS = [("ptr", "x"), ("ptr", "q"), ("ptr", "d"), ("ptr", "e"), ("i64", "n_blocks")]


def _f16_round(fn: Function, value: str) -> str:
    h = fn.v(f"fptrunc float {value} to half")
    return fn.v(f"fpext half {h} to float")


def _q8_0_block(fn: Function, i: str, with_sum: bool) -> None:
    x = fn.load("<32 x float>", fn.gep("%x", fn.v(f"mul i64 {i}, 32"), "float"), 4)
    amax = fn.v(f"call float @llvm.vector.reduce.fmax.v32f32(<32 x float> "
                f"{fn.v(f'call <32 x float> @llvm.fabs.v32f32(<32 x float> {x})')})")
    d = fn.v(f"fdiv float {amax}, 127.0")
    nonzero = fn.v(f"fcmp une float {amax}, 0.0")
    inv = fn.v(f"select i1 {nonzero}, float {fn.v(f'fdiv float 127.0, {amax}')}, float 0.0")
    scaled = fn.v(f"fmul <32 x float> {x}, {fn.splat_value(32, 'float', inv)}")
    q = fn.v(f"fptosi <32 x float> {fn.v(f'call <32 x float> @llvm.rint.v32f32(<32 x float> {scaled})')} to <32 x i8>")
    fn.store("<32 x i8>", q, fn.gep("%q", fn.v(f"mul i64 {i}, 32")))
    fn.store("float", _f16_round(fn, d), fn.gep("%d", i, "float"), 4)
    if with_sum:
        total = fn.v(f"call i32 @llvm.vector.reduce.add.v32i32(<32 x i32> {fn.v(f'sext <32 x i8> {q} to <32 x i32>')})")
        s = fn.v(f"fmul float {d}, {fn.v(f'sitofp i32 {total} to float')}")
        fn.store("float", _f16_round(fn, s), fn.gep("%e", i, "float"), 4)


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


def render_quantize(fmt: str) -> tuple[str, str]:
    """(module IR text, function name) for the activation quantizer of one format."""
    fn = Function(f"kin_quantize_{fmt}", PARAMS)
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

    fn.loop(0, "%n_blocks", [], step)
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
