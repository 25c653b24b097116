"""Rows alone in the quantized matmul kernels (decode, and rows left below a tile) of the types without a
two-row decoder (the K-quants): for each column, each row's fma chain over the blocks.

Owns: the per-block float step of one row in each order ("lanes": 8 float lanes; "scalar": one float,
its minimum as a second lane of one <2 x float> fma on x86), Q4_K's 512-bit single-row path on VNNI,
and the loop over rows and blocks of one column (`single_rows`). The order is matmul_ir.py's.
"""

from __future__ import annotations

from kinetic.codegen.cpu.llvm_ir import Function
from kinetic.codegen.cpu.matmul_block_ir import (
    Rows,
    block_dot,
    decode_block,
    fma,
    fold16,
    hsum,
    min_dot,
    min_term,
    reduce_pair,
    sums16,
)
from kinetic.codegen.cpu.quant_blocks import Block, Layout


def _accumulate_scalar(fn: Function, blk: Block, row: Rows, b: str, isum: str, dx: str, acc: str, accm: str):
    """Q4_K as ggml_gemv_q4_K_8x8_q8_K: acc = fma(float(iacc), d_w*d_x, acc),
    accm = fma(float(imin), dmin*d_x, accm), with iacc and imin exact int32 per super-block."""
    iacc = fn.v(f"call i32 @llvm.vector.reduce.add.v8i32(<8 x i32> {isum})")
    acc = fma(fn, fn.v(f"sitofp i32 {iacc} to float"), fn.v(f"fmul float {blk.d}, {dx}"), acc)
    if blk.mins is None:  # IQ4_NL, MXFP4: no minimum
        return acc, None
    imin = fn.v(f"sitofp i32 {min_dot(fn, blk, row, b)} to float")
    accm = fma(fn, imin, fn.v(f"fmul float {blk.min_scale}, {dx}"), accm)
    return acc, accm


def _scalar_pairs(layout: Layout, variant: str) -> bool:
    """A row alone of a scalar-order type with minimums carries [acc, accm] as one <2 x float> (x86)."""
    return layout.float_order == "scalar" and layout.has_min and variant != "generic"


def _accumulate_scalar_pair(fn: Function, blk: Block, row: Rows, b: str, isum: str, dx: str, acc2: str) -> str:
    """The scalar order's two fmas as the lanes of one: [acc, accm] = fma([f32(iacc), f32(imin)],
    [d_w * d_x, dmin * d_x], [acc, accm]); imin's products by one `vpmaddwd` on 16-bit mins and Q8_K
    sums (|sum of 16 int8| < 2^15), and iacc, imin reduced by one shuffle tree (all exact)."""
    sums = fn.v(f"trunc <16 x i32> {sums16(fn, row, b)} to <16 x i16>")
    mins = fn.v(f"trunc <16 x i32> {blk.mins} to <16 x i16>")
    m8 = fn.v(f"call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> {mins}, <16 x i16> {sums})")
    ints = fn.v(f"sitofp <2 x i32> {reduce_pair(fn, isum, m8)} to <2 x float>")
    ds = fn.v(f"insertelement <2 x float> {fn.v(f'insertelement <2 x float> poison, float {blk.d}, i64 0')}, "
              f"float {blk.min_scale}, i64 1")
    scale = fn.v(f"fmul <2 x float> {ds}, {fn.splat_value(2, 'float', dx)}")
    return fn.v(f"call <2 x float> @llvm.fma.v2f32(<2 x float> {ints}, <2 x float> {scale}, <2 x float> {acc2})")


def _accumulate_wide(fn: Function, layout: Layout, row: Rows, wrow: str, b: str, acc: str) -> str:
    """Q4_K on VNNI, one row: <2 x float> [acc, accm] <- fma([float(iacc), float(imin)],
    [d_w * d_x, dmin * d_x], [acc, accm]): the scalar order's two fmas as the lanes of one. 512-bit
    pmaddubsw + vpdpwssd over 64 weights at a time, and the integer totals iacc, imin reduced together."""
    blk_ptr = fn.gep(wrow, fn.v(f"mul i64 {b}, {layout.block_bytes}"))
    blk = layout.decode_wide(fn, blk_ptr)
    xb = fn.gep(row.xq, fn.v(f"mul i64 {b}, 256"))
    chains = ["zeroinitializer"] * 2
    for p in range(4):
        x = fn.load("<64 x i8>", fn.gep(xb, 64 * p))
        pairs = fn.v(f"call <32 x i16> @llvm.x86.avx512.pmaddubs.w.512(<64 x i8> {blk.quants[p]}, <64 x i8> {x})")
        chains[p % 2] = fn.v(f"call <16 x i32> @llvm.x86.avx512.vpdpwssd.512(<16 x i32> {chains[p % 2]}, "
                             f"<32 x i16> {pairs}, <32 x i16> {blk.scales[p]})")
    t16 = fn.v(f"add <16 x i32> {chains[0]}, {chains[1]}")
    sums = fn.v(f"trunc <16 x i32> {sums16(fn, row, b)} to <16 x i16>")  # |sum of 16 int8| < 2^15
    m8 = fn.v(f"call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> {blk.mins}, <16 x i16> {sums})")
    ints = fn.v(f"sitofp <2 x i32> {reduce_pair(fn, fold16(fn, t16), m8)} to <2 x float>")
    dmin = fn.v(f"fpext <2 x half> {fn.load('<2 x half>', blk_ptr)} to <2 x float>")
    dx = fn.load("float", fn.gep(row.xd, b, "float"), 4)
    scale = fn.v(f"fmul <2 x float> {dmin}, {fn.splat_value(2, 'float', dx)}")
    return fn.v(f"call <2 x float> @llvm.fma.v2f32(<2 x float> {ints}, <2 x float> {scale}, <2 x float> {acc})")


def _accumulate(fn: Function, layout: Layout, variant: str, rows: list[Rows], wrow: str, b: str, accs: list[str]):
    blk = decode_block(fn, layout, variant, fn.gep(wrow, fn.v(f"mul i64 {b}, {layout.block_bytes}")))
    new_acc, new_min = [], []
    for i, row in enumerate(rows):
        isum = block_dot(fn, variant, blk, row, b, layout.block)
        dx = fn.load("float", fn.gep(row.xd, b, "float"), 4)
        if _scalar_pairs(layout, variant):  # accs[i] = <2 x float> [acc, accm]
            new_acc.append(_accumulate_scalar_pair(fn, blk, row, b, isum, dx, accs[i]))
            continue
        if layout.float_order == "scalar":
            accm = accs[len(rows) + i] if layout.has_min else None
            acc, accm = _accumulate_scalar(fn, blk, row, b, isum, dx, accs[i], accm)
            new_acc.append(acc)
            new_min += [accm] if layout.has_min else []
            continue
        scale = fn.splat_value(8, "float", fn.v(f"fmul float {blk.d}, {dx}"))
        lanes = fn.v(f"sitofp <8 x i32> {isum} to <8 x float>")
        new_acc.append(
            fn.v(f"call <8 x float> @llvm.fma.v8f32(<8 x float> {scale}, <8 x float> {lanes}, <8 x float> {accs[i]})")
        )
        if layout.has_min:
            new_min.append(min_term(fn, layout, blk, row, b, dx, accs[len(rows) + i]))
    return new_acc + new_min


def _row_tile(fn: Function, layout: Layout, variant: str, k: int, wrow: str, n: str, first_row: str, tile: int):
    rows = [Rows(fn, fn.v(f"add i64 {first_row}, {i}"), k, layout) for i in range(tile)]
    scalar = layout.float_order == "scalar"
    has_min = layout.has_min
    carried = [("float" if scalar else "<8 x float>", "0.0" if scalar else "zeroinitializer")] * tile
    carried += [("float", "0.0")] * tile if has_min else []
    wide = tile == 1 and variant == "vnni" and layout.decode_wide is not None
    paired = wide or _scalar_pairs(layout, variant)
    if paired:
        carried = [("<2 x float>", "zeroinitializer")] * tile

    def step(b: str, accs: list[str]) -> list[str]:
        if wide:
            return [_accumulate_wide(fn, layout, rows[0], wrow, b, accs[0])]
        return _accumulate(fn, layout, variant, rows, wrow, b, accs)

    finals = fn.loop(0, k // layout.block, carried, step)
    if paired:  # [acc of each row] + [accm of each row]
        finals = [fn.v(f"extractelement <2 x float> {f}, i64 {i}") for i in range(2) for f in finals]
    for i, row in enumerate(rows):
        if scalar:
            y = fn.v(f"fsub float {finals[i]}, {finals[tile + i]}") if has_min else finals[i]
        else:
            y = hsum(fn, finals[i])
            if has_min:
                y = fn.v(f"fadd float {y}, {finals[tile + i]}")
        at = fn.v(f"add i64 {fn.v(f'mul i64 {row.r}, %ldo')}, {n}")
        fn.store("float", y, fn.gep("%out", at, "float"), 4)


def single_rows(fn: Function, layout: Layout, variant: str, k: int, n: str, first_row: str) -> None:
    """Column n for rows [first_row, m), one row at a time (decode, M below a tile, leftover rows)."""
    wrow = fn.gep("%w", fn.v(f"mul i64 {n}, {k // layout.block * layout.block_bytes}"))

    def single(r: str, _carried: list[str]) -> list[str]:
        _row_tile(fn, layout, variant, k, wrow, n, r, 1)
        return []

    fn.loop(first_row, "%m", [], single)
