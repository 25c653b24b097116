"""Rows alone of block-32 types in the "lanes" order (decode, and rows left below a tile): two
adjacent weight rows at a time, so that their fma chains share vectors (`column_pairs`).

Owns: `column_pairs`, its per-row scratch (`pair_scratch`) and software prefetch, and `column_step`,
the column sweep's chunking that matmul_columns_ir's quads share. The order is matmul_ir.py's, two
rows per vector op. The "scalar" order's eight columns at a time are matmul_columns_ir's.
"""

from __future__ import annotations

from kinetic.codegen.cpu.llvm_ir import Function, const_vec, splat
from kinetic.codegen.cpu.matmul_block_ir import CHUNK_BYTES, column_chunks, fill_corrections, fma8, row_offset
from kinetic.codegen.cpu.quant_blocks import Layout
from kinetic.codegen.cpu.target import dot8, dot8_acc

# ---- leftover rows of block-32 types (decode): two weight rows at a time ------------------------------
#
# One row's float work per block is a chain of dependent operations (the fma into its accumulator),
# so a column alone runs at the fma latency per block. Two adjacent weight rows (a, c) run together:
# their block b is decoded into one PairBlock, whose two dot8s give [a's lanes 0-3 | c's lanes 0-3]
# and [a's lanes 4-7 | c's lanes 4-7]; the float side is the same per-lane operations, two rows per
# vector: [d_a, m_a, d_c, m_c] converted at once, times the row's [d_x, s_x, d_x, s_x] (a scratch per
# block, so d_w * d_x and m * s are one multiply), then fma(d_w * d_x, float(lanes), acc) on both
# halves and accm + m * s on a vector whose lanes 1 and 3 are a's and c's accm. The final sums are the
# single-row tree ((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7)) + accm, two rows per vector operation.
# An odd last column pairs with itself. A software prefetch reads the pairs PREFETCH_BYTES ahead:
# without it the two interleaved rows defeat the hardware prefetcher (2-4x slower from memory).

PREFETCH_BYTES = 4096  # how far ahead of a pair of rows its software prefetch reads (whole pairs)


def _pair_sum(fn: Function, finals: list[str], has_min: bool) -> str:
    """<2 x float> [y_a, y_c] from the pair's accumulators, each the single-row sequence of fadds."""
    s8 = fn.v(f"fadd <8 x float> {finals[0]}, {finals[1]}")  # lane i: acc_i + acc_(i+4) of a, then of c

    def pick(v: str, n: int, idx: list[int]) -> str:
        return fn.v(f"shufflevector <{n} x float> {v}, <{n} x float> poison, {const_vec('i32', idx)}")

    t4 = fn.v(f"fadd <4 x float> {pick(s8, 8, [0, 1, 4, 5])}, {pick(s8, 8, [2, 3, 6, 7])}")
    y = fn.v(f"fadd <2 x float> {pick(t4, 4, [0, 2])}, {pick(t4, 4, [1, 3])}")
    if has_min:
        y = fn.v(f"fadd <2 x float> {y}, {pick(finals[2], 4, [1, 3])}")
    return y


def pair_scratch(fn: Function, layout: Layout, variant: str, k: int) -> tuple[str, str | None]:
    """Stack scratch of one row for `column_pairs` (allocated in the entry block): [d_x, s_x, d_x, s_x] per
    block and, for offset types, the row's corrections (K bytes together with the scales' K/2)."""
    xs = fn.v(f"alloca float, i64 {4 * (k // 32)}, align 32")
    return xs, fn.v(f"alloca i32, i64 {k // 4}, align 32") if row_offset(layout, variant) else None


def column_step(fn: Function, layout: Layout, variant: str, k: int, first_row: str,
                 width: int) -> tuple[int, int, int, int, str]:
    """What a column sweep of `width` weight rows at a time starts with: blocks per row, bytes per
    block, bytes per row, the weight offset (row_offset), and the columns a chunk takes (every
    column with one row, else a multiple of `width` near CHUNK_BYTES)."""
    nb, bb = k // 32, layout.block_bytes
    rb = nb * bb
    offset = row_offset(layout, variant)
    cols = fn.v("sub i64 %n1, %n0")
    all_cols = fn.v(f"select i1 {fn.v(f'icmp sgt i64 {cols}, 0')}, i64 {cols}, i64 1")
    several = fn.v(f"icmp sgt i64 {fn.v(f'sub i64 %m, {first_row}')}, 1")
    chunk = max(width, CHUNK_BYTES // rb // width * width)
    return nb, bb, rb, offset, fn.v(f"select i1 {several}, i64 {chunk}, i64 {all_cols}")


def column_pairs(fn: Function, layout: Layout, variant: str, k: int, first_row: str, xs: str, corr: str | None) -> None:
    """Columns [n0, n1) for rows [first_row, m), two columns at a time. With one row (decode) all
    columns run in one sweep; with more, in chunks of ~CHUNK_BYTES so the rows reuse them from L2."""
    nb, bb, rb, offset, step = column_step(fn, layout, variant, k, first_row, 2)
    has_min = layout.has_min
    ahead = -(-PREFETCH_BYTES // (2 * rb)) * 2 * rb
    dup4 = const_vec("i32", [0, 1, 2, 3] * 2)
    dup16 = const_vec("i32", list(range(16)) * 2)

    def fill_scales(r: str) -> None:  # xs[b] = [d_x, s_x, d_x, s_x] (s_x: Q8_1's, else 0)
        xd = fn.gep("%xd", fn.v(f"mul i64 {r}, {nb}"), "float")
        xe = fn.gep("%xe", fn.v(f"mul i64 {r}, {nb}"), "float") if layout.activation == "q8_1" else None

        def body(b: str, _c: list[str]) -> list[str]:
            dx = fn.load("float", fn.gep(xd, b, "float"), 4)
            v = fn.v(f"insertelement <4 x float> zeroinitializer, float {dx}, i64 0")
            if xe is not None:
                v = fn.v(f"insertelement <4 x float> {v}, float {fn.load('float', fn.gep(xe, b, 'float'), 4)}, i64 1")
            v = fn.v(f"shufflevector <4 x float> {v}, <4 x float> poison, {const_vec('i32', [0, 1, 0, 1])}")
            fn.store("<4 x float>", v, fn.gep(xs, fn.v(f"mul i64 {b}, 4"), "float"), 16)
            return []

        fn.loop(0, nb, [], body)

    def pair(xrow: str, orow: str, p: str, c1: str) -> None:
        q = fn.v(f"add i64 {p}, 1")
        last = fn.v(f"sub i64 {c1}, 1")
        q = fn.v(f"select i1 {fn.v(f'icmp slt i64 {q}, {c1}')}, i64 {q}, i64 {last}")
        wa = fn.gep("%w", fn.v(f"mul i64 {p}, {rb}"))
        wc = fn.gep("%w", fn.v(f"mul i64 {q}, {rb}"))

        def block(b: str, accs: list[str]) -> list[str]:
            at = fn.v(f"mul i64 {b}, {bb}")
            if PREFETCH_BYTES:
                fn.prefetch(wa, fn.v(f"add i64 {fn.v(f'mul i64 {b}, {2 * bb}')}, {ahead}"))
            a, c = fn.gep(wa, at), fn.gep(wc, at)
            pb = layout.decode_pair(fn, a, c)
            h = fn.v(f"shufflevector <2 x half> {fn.load('<2 x half>', a)}, <2 x half> {fn.load('<2 x half>', c)}, "
                     f"{const_vec('i32', range(4))}")
            xs4 = fn.load("<4 x float>", fn.gep(xs, fn.v(f"mul i64 {b}, 4"), "float"), 16)
            prod = fn.v(f"fmul <4 x float> {fn.v(f'fpext <4 x half> {h} to <4 x float>')}, {xs4}")
            scale = fn.v(f"shufflevector <4 x float> {prod}, <4 x float> poison, {const_vec('i32', [0] * 4 + [2] * 4)}")
            xb = fn.gep(xrow, fn.v(f"mul i64 {b}, 32"))
            xl = fn.v(f"shufflevector <16 x i8> {fn.load('<16 x i8>', xb)}, <16 x i8> poison, {dup16}")
            xh = fn.v(f"shufflevector <16 x i8> {fn.load('<16 x i8>', fn.gep(xb, 16))}, <16 x i8> poison, {dup16}")
            if offset:
                cb = fn.gep(corr, fn.v(f"mul i64 {b}, 8"), "i32")  # two 16-byte broadcast loads
                cl = fn.v(f"shufflevector <4 x i32> {fn.load('<4 x i32>', cb, 16)}, <4 x i32> poison, {dup4}")
                c_hi = fn.load("<4 x i32>", fn.gep(cb, 4, "i32"), 16)
                ch = fn.v(f"shufflevector <4 x i32> {c_hi}, <4 x i32> poison, {dup4}")
                flip = (lambda w: fn.v(f"xor <32 x i8> {w}, {splat('i8', -128)}")) if pb.signed else (lambda w: w)
                il = dot8_acc(fn, variant, cl, flip(pb.low), xl, False)
                ih = dot8_acc(fn, variant, ch, flip(pb.high), xh, False)
            else:
                il = dot8(fn, variant, pb.low, xl, pb.signed)
                ih = dot8(fn, variant, pb.high, xh, pb.signed)
            new = [fma8(fn, scale, fn.v(f"sitofp <8 x i32> {v} to <8 x float>"), acc)
                   for v, acc in zip((il, ih), accs[:2], strict=True)]
            if has_min:
                new.append(fn.v(f"fadd <4 x float> {accs[2]}, {prod}"))
            return new

        carried = [("<8 x float>", "zeroinitializer")] * 2 + [("<4 x float>", "zeroinitializer")] * has_min
        y = _pair_sum(fn, fn.loop(0, nb, carried, block), has_min)
        for i, n in enumerate((p, q)):
            e = fn.v(f"extractelement <2 x float> {y}, i64 {i}")
            fn.store("float", e, fn.gep(orow, n, "float"), 4)

    def chunk(c0: str, c1: str) -> None:
        def row(r: str, _c2: list[str]) -> list[str]:
            fill_scales(r)
            if offset:
                fill_corrections(fn, layout, variant, k, r, corr)
            xrow = fn.gep("%xq", fn.v(f"mul i64 {r}, {k}"))
            orow = fn.gep("%out", fn.v(f"mul i64 {r}, %ldo"), "float")
            fn.loop(c0, c1, [], lambda p, _c3: pair(xrow, orow, p, c1) or [], step=2)
            return []

        fn.loop(first_row, "%m", [], row)

    column_chunks(fn, step, chunk)
