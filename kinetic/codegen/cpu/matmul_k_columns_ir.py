"""Rows alone (decode, rows left below a tile) of Q6_K, Q5_K, Q3_K and IQ4_XS in the fast order
"block_chain", and of Q4_K (whose ggml order is that order: both modes' kernel): `columns(layout)`
weight columns at a time, their float steps as the lanes of one vector.

Owns: the column groups' loop (`chain_columns`), the exact transpose-add of the columns' integer lane
sums (`_lane_totals`) and the software prefetch in front of the groups. Decoding a block and its
integer dot with a row are matmul_block_ir's (`decode_block`, `block_dot`), the order matmul_ir.py's
"scalar" one, per column and super-block b:

    acc  = fma(float(isum), d_w * d_x, acc)        isum: the exact int32 sum of block_dot's 8 lanes
    accm = fma(float(imin), dmin * d_x, accm)      Q5_K: imin = sum_j min_j * (sub-block j's x sum)
    y    = acc (Q5_K: acc - accm)

matmul_rows_ir runs this one column at a time, one horizontal integer sum (a shuffle tree) per column
and super-block, about as much work as the fma chain it feeds. Here the COLUMNS columns' <8 x i32>
sums (and Q5_K's imin products) are reduced together by one transpose-add tree, whose lanes end as
the columns' totals in order (integers: exact, grouping free), then one sitofp, one multiply and one
fma on <COLUMNS x float> (Q5_K: <2 * COLUMNS x float> [acc.., accm..]): each lane is its column's own
float operation on the same operands, so every output is the single-column code's bits (and the
reference's). A last group short of COLUMNS repeats the last column (the same value stored again).
Q6_K's -32 (through the activation sums) is one 16-bit `vpmaddwd` on x86 (`_block_sums`): only the
lanes' total matters here, so block_dot's 32-bit multiply and lane-pair shuffles are not needed;
Q3_K's 256x scales (`scale16_shift`) shifted back once on the totals, not on each column's 8 lanes
(a total of 8 lanes each below 2^27.1 stays below 2^31: exact).
Measured (benchmarks/matmul_decode_ab.py --k 2048, CPU time, docs/cpu-kernels.md): Q6_K decode
0.92-0.99x the ggml order's speed before, 1.23-1.27x after; COLUMNS 4 and 8 were slower than 2
(8 KB prefetch: without it the interleaved rows defeat the hardware prefetcher, 0.3-0.4x).
Q4_K ran one column at a time through 512-bit vectors (matmul_rows_ir, decode_q4_k_wide); here,
four columns at a time, a row alone (decode) in cache is 1.2-1.3x faster (K 1024 and 2048, Zen 4,
CPU time; two columns: 1.1-1.2x), the same bits; with 3 or 6 rows left the 512-bit rows were faster
(1.2x, 1.35x), so Q4_K takes the groups for one row only, `rows_alone` otherwise (a branch at run time).
The group's rows are one contiguous span: its prefetch walks the span COLUMNS times as fast as a
row, PREFETCH_BYTES ahead, clamped to the call's columns, with the first window prefetched at the
call's start (the block-32 chain quads' scheme, matmul_columns_ir).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.llvm_ir import Function, const_vec, splat
from kinetic.codegen.cpu.matmul_block_ir import Rows, block_dot, decode_block, fold16, sums16
from kinetic.codegen.cpu.quant_blocks import Layout

COLUMNS = 2  # columns a super-block step runs (2 or 4, the fma widths declared: the same bits; 2 beat 4 and 8)
TYPE_COLUMNS = {Q.Q4_K: 4}  # where another width measured faster
GGML_CHAIN = {Q.Q4_K}  # K-quants whose ggml order is block_chain's (scalar) and that run here in it too
PREFETCH_BYTES = 8192  # how far ahead of the group in flight its software prefetch reads


def applies(layout: Layout) -> bool:
    """The K-quants without a two-row decoder in block_chain: in an order other than their ggml one,
    or in their ggml one where that is block_chain's (GGML_CHAIN)."""
    chain = layout.dot_order is not None or layout.wtype in GGML_CHAIN
    return chain and layout.decode_pair is None and layout.block == 256


def columns(layout: Layout) -> int:
    """The columns a group runs (COLUMNS, or TYPE_COLUMNS' width for the type)."""
    return TYPE_COLUMNS.get(layout.wtype, COLUMNS)


def _merge(fn: Function, a: str, b: str | None, cols: int, lanes: int) -> tuple[str, int]:
    """a (and b): `cols` columns of `lanes` lanes each, in order -> one vector of the same columns (a's
    then b's) with lanes / 2 lanes each: lane h of a column's half plus lane h + lanes / 2 (exact)."""
    total = cols * (2 if b is not None else 1)
    first, second = [], []
    for q in range(total):
        for h in range(lanes // 2):
            first.append(q * lanes + h)
            second.append(q * lanes + lanes // 2 + h)
    ty = f"<{cols * lanes} x i32>"
    other = b if b is not None else "poison"
    lo = fn.v(f"shufflevector {ty} {a}, {ty} {other}, {const_vec('i32', first)}")
    hi = fn.v(f"shufflevector {ty} {a}, {ty} {other}, {const_vec('i32', second)}")
    return fn.v(f"add <{len(first)} x i32> {lo}, {hi}"), len(first)


def _lane_totals(fn: Function, sums: list[str]) -> str:
    """<len(sums) x i32>: lane c the sum of sums[c]'s 8 lanes (<8 x i32> each; len a power of two)."""
    vectors, cols, lanes = list(sums), 1, 8
    while len(vectors) > 1:
        vectors = [_merge(fn, a, b, cols, lanes)[0] for a, b in zip(vectors[0::2], vectors[1::2], strict=True)]
        cols, lanes = cols * 2, lanes // 2
    v = vectors[0]
    while lanes > 1:
        v, _ = _merge(fn, v, None, cols, lanes)
        lanes //= 2
    return v


def _min_sums(fn: Function, variant: str, blk, row: Rows, b: str) -> str:
    """<8 x i32> whose lanes sum to imin = sum_j min_j * (sub-block j's x sum), exact (|x sum| < 2^15)."""
    if variant == "generic":
        return fold16(fn, fn.v(f"mul <16 x i32> {blk.mins}, {sums16(fn, row, b)}"))
    sums = fn.v(f"trunc <16 x i32> {sums16(fn, row, b)} to <16 x i16>")
    mins = fn.v(f"trunc <16 x i32> {blk.mins} to <16 x i16>")
    return fn.v(f"call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> {mins}, <16 x i16> {sums})")


def _block_sums(fn: Function, variant: str, blk, row: Rows, b: str, block: int) -> str:
    """<8 x i32> whose lanes sum to the block's integer dot. Q6_K's -32 (`offsets`, 32 * scale per
    16 values, |32 * scale| <= 4096, |x sum of 16| < 2^15) on x86 by one `vpmaddwd` on 16-bit
    operands, instead of block_dot's 32-bit multiply and lane-pair shuffles (the same integer)."""
    if blk.offsets is None or variant == "generic":
        return block_dot(fn, variant, blk, row, b, block)
    dot = block_dot(fn, variant, replace(blk, offsets=None), row, b, block)
    sums = fn.v(f"trunc <16 x i32> {sums16(fn, row, b)} to <16 x i16>")
    offsets = fn.v(f"trunc <16 x i32> {blk.offsets} to <16 x i16>")
    off = fn.v(f"call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> {offsets}, <16 x i16> {sums})")
    return fn.v(f"sub <8 x i32> {dot}, {off}")


def _vector(fn: Function, elem: str, values: list[str]) -> str:
    v = "poison"
    for i, value in enumerate(values):
        v = fn.v(f"insertelement <{len(values)} x {elem}> {v}, {elem} {value}, i64 {i}")
    return v


def _group_step(fn: Function, layout: Layout, variant: str, row: Rows, wrows: list[str], b: str, acc: str) -> str:
    """One super-block b of the group's columns against one row: acc <- fma(totals, scales, acc)."""
    at = fn.v(f"mul i64 {b}, {layout.block_bytes}")
    blks = [decode_block(fn, layout, variant, fn.gep(w, at)) for w in wrows]
    shift = blks[0].scale16_shift if variant != "generic" and not layout.has_min else 0
    sums = [_block_sums(fn, variant, replace(blk, scale16_shift=0), row, b, layout.block) for blk in blks]
    scales = [blk.d for blk in blks]
    if layout.has_min:
        sums += [_min_sums(fn, variant, blk, row, b) for blk in blks]
        scales += [blk.min_scale for blk in blks]
    width = len(sums)
    totals = _lane_totals(fn, sums)
    if shift:  # Q3_K's scales were 256x: the totals (each below 2^31) shifted back once, not each lane
        totals = fn.v(f"ashr <{width} x i32> {totals}, {splat('i32', shift)}")
    ints = fn.v(f"sitofp <{width} x i32> {totals} to <{width} x float>")
    dx = fn.load("float", fn.gep(row.xd, b, "float"), 4)
    scale = fn.v(f"fmul <{width} x float> {_vector(fn, 'float', scales)}, {fn.splat_value(width, 'float', dx)}")
    vf = f"<{width} x float>"
    return fn.v(f"call {vf} @llvm.fma.v{width}f32({vf} {ints}, {vf} {scale}, {vf} {acc})")


def _at_most(fn: Function, value: str, limit: str) -> str:
    return fn.v(f"select i1 {fn.v(f'icmp slt i64 {value}, {limit}')}, i64 {value}, i64 {limit}")


def _lead_in(fn: Function, rb: int) -> None:
    """Prefetches of the first PREFETCH_BYTES of the call's columns (all when fewer), a cache line each."""
    span = fn.v(f"mul i64 {fn.v('sub i64 %n1, %n0')}, {rb}")
    base = fn.gep("%w", fn.v(f"mul i64 %n0, {rb}"))
    fn.loop(0, _at_most(fn, span, str(PREFETCH_BYTES)), [], lambda at, _c: fn.prefetch(base, at) or [], step=64)


def _when(fn: Function, cond: str, body: Callable[[], None]) -> None:
    """body's code run where the i1 `cond` holds (a loop of zero or one trips)."""
    fn.loop(0, fn.v(f"zext i1 {cond} to i64"), [], lambda _i, _c: body() or [])


def chain_columns(fn: Function, layout: Layout, variant: str, k: int, first_row: str,
                  rows_alone: Callable[[], None]) -> None:
    """Columns [n0, n1) for rows [first_row, m), `columns(layout)` columns at a time; GGML_CHAIN's
    types only where one row is left, `rows_alone()` (the caller's loops) where more are."""
    if layout.wtype in GGML_CHAIN and layout.dot_order is None:
        one = fn.v(f"icmp eq i64 {fn.v(f'sub i64 %m, {first_row}')}, 1")
        _when(fn, one, lambda: _groups(fn, layout, variant, k, first_row))
        _when(fn, fn.v(f"xor i1 {one}, true"), rows_alone)
    else:
        _groups(fn, layout, variant, k, first_row)


def _groups(fn: Function, layout: Layout, variant: str, k: int, first_row: str) -> None:
    """Columns [n0, n1) for rows [first_row, m), `columns(layout)` columns at a time."""
    n_cols = columns(layout)
    nb = k // layout.block
    rb = nb * layout.block_bytes
    width = n_cols * (2 if layout.has_min else 1)
    lines = -(-n_cols * layout.block_bytes // 64)  # cache lines the group's super-blocks span
    ahead = -(-PREFETCH_BYTES // (n_cols * rb)) * n_cols * rb
    if PREFETCH_BYTES:
        _lead_in(fn, rb)

    def group(p: str, _c: list[str]) -> list[str]:
        last = fn.v("sub i64 %n1, 1")
        cols = [p] + [_at_most(fn, fn.v(f"add i64 {p}, {j}"), last) for j in range(1, n_cols)]
        wrows = [fn.gep("%w", fn.v(f"mul i64 {c}, {rb}")) for c in cols]
        cols_left = fn.v(f"sub i64 %n1, {p}")
        limit = fn.v(f"sub i64 {fn.v(f'mul i64 {cols_left}, {rb}')}, 1")  # the call's last byte from p's row

        def row(r: str, _c2: list[str]) -> list[str]:
            rows = Rows(fn, r, k, layout)

            def step(b: str, accs: list[str]) -> list[str]:
                ahead_at = fn.v(f"add i64 {fn.v(f'mul i64 {b}, {n_cols * layout.block_bytes}')}, {ahead}")
                for line in range(lines if PREFETCH_BYTES else 0):
                    off = ahead_at if not line else fn.v(f"add i64 {ahead_at}, {64 * line}")
                    fn.prefetch(wrows[0], _at_most(fn, off, limit))
                return [_group_step(fn, layout, variant, rows, wrows, b, accs[0])]

            acc = fn.loop(0, nb, [(f"<{width} x float>", "zeroinitializer")], step)[0]
            orow = fn.gep("%out", fn.v(f"mul i64 {r}, %ldo"), "float")
            for j, c in enumerate(cols):
                y = fn.v(f"extractelement <{width} x float> {acc}, i64 {j}")
                if layout.has_min:
                    y = fn.v(f"fsub float {y}, {fn.v(f'extractelement <{width} x float> {acc}, i64 {n_cols + j}')}")
                fn.store("float", y, fn.gep(orow, c, "float"), 4)
            return []

        fn.loop(first_row, "%m", [], row)
        return []

    fn.loop("%n0", "%n1", [], group, step=n_cols)
