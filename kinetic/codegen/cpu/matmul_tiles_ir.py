"""Tiles of T > 1 activation rows in the quantized matmul kernels (prompts): each decoded weight block
serves every row of the tile.

Owns: the tile loops (`row_tiles`: column chunks, then tiles, then columns, then blocks), the scratch
of the tile's float scales laid out [block][row], the 8-row vector float steps, and, for the block-32
"scalar" types (IQ4_NL, MXFP4), the interleaved activations that keep rows in lanes. Each lane is one
row's own float operation on the same operands as the single-row code (matmul_ir.py's order).
"""

from __future__ import annotations

from kinetic.codegen.cpu.llvm_ir import Function, const_vec, splat
from kinetic.codegen.cpu.matmul_block_ir import (
    CHUNK_BYTES,
    Rows,
    block_dot,
    column_chunks,
    decode_block,
    fill_corrections,
    fma8,
    fold16,
    hsum,
    row_offset,
    sums16,
)
from kinetic.codegen.cpu.quant_blocks import Block, Layout
from kinetic.codegen.cpu.target import dot8_acc

# ---- tiles of T > 1 rows: row-tile-major, with the tile's float scales transposed once -------------
#
# For a tile of T rows the kernel first copies the rows' d_x (and Q8_1's s) into a stack scratch
# laid out [block][row] (groups of 8 rows), once per tile and column chunk. Then per weight block the
# products d_w * d_x of 8 rows are one vector multiply, Q4_1/Q5_1's m * s terms one multiply and one
# add on 8 rows' accm, and Q4_K's per-row integer sums are reduced together (a transpose-add tree)
# into 8 rows' lanes before one fma. Each lane is one row's own float operation on the same operands
# as the single-row code, so the per-element sequence is unchanged.

GROUP = 8


def _transpose_sum(fn: Function, vs: list[str]) -> list[str]:
    """<8 x i32> per 8 inputs: lane i = the sum of input i's 8 lanes (exact; a shuffle-add tree)."""
    even, odd = const_vec("i32", range(0, 16, 2)), const_vec("i32", range(1, 16, 2))
    out = []
    for g in range(0, len(vs), GROUP):
        level = vs[g : g + GROUP] + ["zeroinitializer"] * (GROUP - len(vs[g : g + GROUP]))
        while len(level) > 1:
            nxt = []
            for a, b in zip(level[0::2], level[1::2], strict=True):
                lo = fn.v(f"shufflevector <8 x i32> {a}, <8 x i32> {b}, {even}")
                hi = fn.v(f"shufflevector <8 x i32> {a}, <8 x i32> {b}, {odd}")
                nxt.append(fn.v(f"add <8 x i32> {lo}, {hi}"))
            level = nxt
        out.append(level[0])
    return out


def _min_lanes(fn: Function, blk: Block, row: Rows, b: str) -> str:
    """<8 x i32> whose lanes sum to sum_j mins[j] * bsum_j (exact)."""
    return fold16(fn, fn.v(f"mul <16 x i32> {blk.mins}, {sums16(fn, row, b)}"))


def _tile_block(fn, layout, variant, rows, groups, wrow, b, dxt, st, accs):
    """One block for T rows. accs: lanes: T row accs (+ groups accm); scalar: groups acc + groups accm."""
    t = len(rows)
    blk = decode_block(fn, layout, variant, fn.gep(wrow, fn.v(f"mul i64 {b}, {layout.block_bytes}")))
    isums = [block_dot(fn, variant, blk, row, b, layout.block) for row in rows]
    base = fn.v(f"mul i64 {b}, {GROUP * groups}")

    def group_vec(src: str, g: str) -> str:
        return fn.load("<8 x float>", fn.gep(src, fn.v(f"add i64 {base}, {GROUP * g}"), "float"), 32)

    dxv = [group_vec(dxt, g) for g in range(groups)]
    if layout.float_order == "scalar":
        iacc = _transpose_sum(fn, isums)
        d8 = fn.splat_value(8, "float", blk.d)
        acc, accm = [], []
        for g in range(groups):
            fa = fn.v(f"sitofp <8 x i32> {iacc[g]} to <8 x float>")
            acc.append(fma8(fn, fa, fn.v(f"fmul <8 x float> {d8}, {dxv[g]}"), accs[g]))
        if not layout.has_min:
            return acc
        imin = _transpose_sum(fn, [_min_lanes(fn, blk, row, b) for row in rows])
        m8 = fn.splat_value(8, "float", blk.min_scale)
        for g in range(groups):
            fm = fn.v(f"sitofp <8 x i32> {imin[g]} to <8 x float>")
            accm.append(fma8(fn, fm, fn.v(f"fmul <8 x float> {m8}, {dxv[g]}"), accs[groups + g]))
        return acc + accm
    d8 = fn.splat_value(8, "float", blk.d)
    new = []
    for i in range(t):  # d_w * d_x of row i in all 8 lanes: a broadcast load and one multiply
        dx = fn.load("float", fn.gep(dxt, fn.v(f"add i64 {base}, {i}"), "float"), 4)
        scale = fn.v(f"fmul <8 x float> {d8}, {fn.splat_value(8, 'float', dx)}")
        lanes = fn.v(f"sitofp <8 x i32> {isums[i]} to <8 x float>")
        new.append(fma8(fn, scale, lanes, accs[i]))
    if layout.has_min:
        m8 = fn.splat_value(8, "float", blk.min_scale)
        for g in range(groups):
            accm = accs[t + g]
            if layout.activation == "q8_1":  # + m * s
                new.append(fn.v(f"fadd <8 x float> {accm}, {fn.v(f'fmul <8 x float> {m8}, {group_vec(st, g)}')}"))
            else:  # - (dmin * d_x) * float(sum_j min_j * bsum_j)
                rs = rows[GROUP * g : GROUP * g + GROUP]
                imin = _transpose_sum(fn, [_min_lanes(fn, blk, row, b) for row in rs])[0]
                neg = fn.v(f"fneg <8 x float> {fn.v(f'fmul <8 x float> {m8}, {dxv[g]}')}")
                new.append(fma8(fn, neg, fn.v(f"sitofp <8 x i32> {imin} to <8 x float>"), accm))
    return new


def _transpose_scales(fn: Function, src: str, per_row: int, first_row: str, t: int, groups: int, dst: str) -> None:
    """dst[b][row] (groups of 8 rows, zero-padded) <- src[first_row + row][b] for b < per_row."""

    def body(b: str, _c: list[str]) -> list[str]:
        for g in range(groups):
            v = "zeroinitializer"
            for i in range(GROUP * g, min(t, GROUP * g + GROUP)):
                r = fn.v(f"add i64 {first_row}, {i}")
                x = fn.load("float", fn.gep(src, fn.v(f"add i64 {fn.v(f'mul i64 {r}, {per_row}')}, {b}"), "float"), 4)
                v = fn.v(f"insertelement <8 x float> {v}, float {x}, i64 {i % GROUP}")
            at = fn.v(f"add i64 {fn.v(f'mul i64 {b}, {GROUP * groups}')}, {GROUP * g}")
            fn.store("<8 x float>", v, fn.gep(dst, at, "float"), 32)
        return []

    fn.loop(0, per_row, [], body)


# ---- tiles of block-32 "scalar" types (IQ4_NL, MXFP4, Q4_0; Q8_0 .. Q5_1 in block_chain): rows in lanes
#
# The gemv order needs each row's whole-block integer total before its fma. Reducing 8 rows' dot8
# lanes by a transpose tree costs more than the dots; instead the tile's activations are laid out
# once per tile (and column chunk) with row r's bytes 4g..4g+3 of block b in dword r of vector g
# (`_interleave`), so that dot8(broadcast of weight dword g, vector g), summed over g, leaves row r's
# total in lane r: 8 vpdpbusd per block for 8 rows and no reduction. Offset types start from
# -offset * (row r's block sum) in lane r, computed with the layout. Q4_1's and Q5_1's minimum:
# accm = fma(m_w, s_x, accm) on 8 rows' s_x, added to acc at the end.

def transpose8(fn: Function, vecs: list[str]) -> list[str]:
    """8 <8 x i32> rows -> 8 columns (a butterfly of shuffles: at stage `bit`, lanes with that bit set
    in vector i trade places with lanes without it in vector i | bit)."""
    for bit in (1, 2, 4):
        out = list(vecs)
        for i in range(8):
            if i & bit:
                continue
            lo = [j if not j & bit else 8 + (j ^ bit) for j in range(8)]
            hi = [j ^ bit if not j & bit else 8 + j for j in range(8)]
            out[i] = fn.v(f"shufflevector <8 x i32> {vecs[i]}, <8 x i32> {vecs[i | bit]}, {const_vec('i32', lo)}")
            out[i | bit] = fn.v(f"shufflevector <8 x i32> {vecs[i]}, <8 x i32> {vecs[i | bit]}, {const_vec('i32', hi)}")
        vecs = out
    return vecs


def _interleave(fn: Function, layout: Layout, variant: str, k: int, first: str, tile: int, xi: str,
                xcorr: str | None) -> None:
    """xi[group][b][g] <- <32 x i8>: bytes 4g..4g+3 of block b of the group's 8 rows, row r in dword r
    (rows past the tile zero); xcorr[group][b] <- <8 x i32>: -offset * (row r's sum over block b)."""
    nb, off = k // 32, row_offset(layout, variant)
    ones = splat("i8", off if off < 128 else off - 256)

    def body(b: str, _c: list[str]) -> list[str]:
        for grp in range(-(-tile // GROUP)):
            rows = []
            for i in range(GROUP * grp, GROUP * grp + GROUP):
                if i >= tile:
                    rows.append("zeroinitializer")
                    continue
                r = fn.v(f"add i64 {first}, {i}")
                at = fn.v(f"add i64 {fn.v(f'mul i64 {r}, {k}')}, {fn.v(f'mul i64 {b}, 32')}")
                rows.append(fn.load("<8 x i32>", fn.gep("%xq", at)))
            at = fn.v(f"add i64 {b}, {grp * nb}")
            start = "zeroinitializer"
            for g, col in enumerate(transpose8(fn, rows)):
                xg = fn.v(f"bitcast <8 x i32> {col} to <32 x i8>")
                fn.store("<32 x i8>", xg, fn.gep(xi, fn.v(f"add i64 {fn.v(f'mul i64 {at}, 256')}, {32 * g}")), 32)
                if off:
                    start = dot8_acc(fn, variant, start, ones, xg, False)
            if off:
                neg = fn.v(f"sub <8 x i32> zeroinitializer, {start}")
                fn.store("<8 x i32>", neg, fn.gep(xcorr, fn.v(f"mul i64 {at}, 8"), "i32"), 32)
        return []

    fn.loop(0, nb, [], body)


def _tile_block_interleaved(fn: Function, layout: Layout, variant: str, k: int, groups: int, wrow: str, b: str,
                            dxt: str, st: str | None, xi: str, xcorr: str | None, accs: list[str]) -> list[str]:
    """One block for the tile's rows as lanes: acc = fma(float(row totals), d_w * d_x, acc) per group
    (then Q4_1's, Q5_1's accm = fma(m_w, s_x, accm) per group)."""
    nb = k // 32
    blk = decode_block(fn, layout, variant, fn.gep(wrow, fn.v(f"mul i64 {b}, {layout.block_bytes}")))
    (chunk,) = blk.chunks
    w, signed = chunk.w, chunk.signed
    if signed and xcorr is not None:  # Q8_0 on VNNI: its bytes read unsigned (+ 128), taken back by xcorr
        w, signed = fn.v(f"xor <32 x i8> {w}, {splat('i8', -128)}"), False
    w32 = fn.v(f"bitcast <32 x i8> {w} to <8 x i32>")
    wg = []
    for g in range(8):
        splat_g = fn.v(f"shufflevector <8 x i32> {w32}, <8 x i32> poison, {const_vec('i32', [g] * 8)}")
        wg.append(fn.v(f"bitcast <8 x i32> {splat_g} to <32 x i8>"))
    d8 = fn.splat_value(8, "float", blk.d)
    new = []
    for grp in range(groups):
        at = fn.v(f"add i64 {b}, {grp * nb}")
        xg = [fn.load("<32 x i8>", fn.gep(xi, fn.v(f"add i64 {fn.v(f'mul i64 {at}, 256')}, {32 * g}")), 32)
              for g in range(8)]
        chains = []
        for half in range(2):  # two independent chains of 4, added (exact)
            acc = "zeroinitializer"
            if half == 0 and xcorr is not None:
                acc = fn.load("<8 x i32>", fn.gep(xcorr, fn.v(f"mul i64 {at}, 8"), "i32"), 32)
            for g in range(half, 8, 2):
                acc = dot8_acc(fn, variant, acc, wg[g], xg[g], signed)
            chains.append(acc)
        total = fn.v(f"sitofp <8 x i32> {fn.v(f'add <8 x i32> {chains[0]}, {chains[1]}')} to <8 x float>")
        base = fn.v(f"add i64 {fn.v(f'mul i64 {b}, {GROUP * groups}')}, {GROUP * grp}")
        dxv = fn.load("<8 x float>", fn.gep(dxt, base, "float"), 32)
        new.append(fma8(fn, total, fn.v(f"fmul <8 x float> {d8}, {dxv}"), accs[grp]))
    if layout.has_min:
        m8 = fn.splat_value(8, "float", blk.min_scale)
        for grp in range(groups):
            base = fn.v(f"add i64 {fn.v(f'mul i64 {b}, {GROUP * groups}')}, {GROUP * grp}")
            sxv = fn.load("<8 x float>", fn.gep(st, base, "float"), 32)
            new.append(fma8(fn, m8, sxv, accs[groups + grp]))
    return new


def row_tiles(fn: Function, layout: Layout, variant: str, k: int, tile: int, dxt: str, st: str | None,
           corr: str | None, inter: tuple[str, str | None] | None = None, start: str = "0") -> str:
    """All full tiles of `tile` rows from row `start` on, over [n0, n1), in column chunks; returns the
    first leftover row. `inter`: the (xi, xcorr) scratch of block-32 scalar types, whose rows run as
    lanes."""
    nb = k // layout.block
    row_bytes = nb * layout.block_bytes
    groups = -(-tile // GROUP)
    chunk = max(1, CHUNK_BYTES // row_bytes)
    tiles = fn.v(f"udiv i64 {fn.v(f'sub i64 %m, {start}')}, {tile}")
    scalar = layout.float_order == "scalar"

    def chunk_body(c0: str, c1: str) -> None:
        def tile_body(tt: str, _c2: list[str]) -> list[str]:
            first = fn.v(f"add i64 {start}, {fn.v(f'mul i64 {tt}, {tile}')}")
            _transpose_scales(fn, "%xd", nb, first, tile, groups, dxt)
            if layout.activation == "q8_1":
                _transpose_scales(fn, "%xe", k // 32, first, tile, groups, st)
            if inter is not None:
                _interleave(fn, layout, variant, k, first, tile, *inter)
            rows = []
            for i in range(tile):
                r = fn.v(f"add i64 {first}, {i}")
                rc = None
                if corr is not None:
                    rc = fn.gep(corr, i * (k // 4), "i32")
                    fill_corrections(fn, layout, variant, k, r, rc)
                rows.append(Rows(fn, r, k, layout, rc))

            def column(n: str, _c3: list[str]) -> list[str]:
                wrow = fn.gep("%w", fn.v(f"mul i64 {n}, {row_bytes}"))
                naccs = groups if scalar else tile
                carried = [("<8 x float>", "zeroinitializer")] * (naccs + (groups if layout.has_min else 0))

                def step(b: str, accs: list[str]) -> list[str]:
                    if inter is not None:
                        return _tile_block_interleaved(fn, layout, variant, k, groups, wrow, b, dxt, st, *inter, accs)
                    return _tile_block(fn, layout, variant, rows, groups, wrow, b, dxt, st, accs)

                finals = fn.loop(0, nb, carried, step)
                for i, row in enumerate(rows):
                    g, lane = divmod(i, GROUP)
                    if scalar:
                        y = fn.v(f"extractelement <8 x float> {finals[g]}, i64 {lane}")
                        if layout.has_min:  # K-quants: acc - accm; Q4_1, Q5_1: acc + accm
                            mm = fn.v(f"extractelement <8 x float> {finals[groups + g]}, i64 {lane}")
                            y = fn.v(f"{'fadd' if layout.activation == 'q8_1' else 'fsub'} float {y}, {mm}")
                    else:
                        y = hsum(fn, finals[i])
                        if layout.has_min:
                            mm = fn.v(f"extractelement <8 x float> {finals[tile + g]}, i64 {lane}")
                            y = fn.v(f"fadd float {y}, {mm}")
                    at = fn.v(f"add i64 {fn.v(f'mul i64 {row.r}, %ldo')}, {n}")
                    fn.store("float", y, fn.gep("%out", at, "float"), 4)
                return []

            fn.loop(c0, c1, [], column)
            return []

        fn.loop(0, tiles, [], tile_body)

    column_chunks(fn, chunk, chunk_body)
    return fn.v(f"add i64 {start}, {fn.v(f'mul i64 {tiles}, {tile}')}")
