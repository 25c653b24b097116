"""Wide tiles of the quantized matmul kernels (prompts on AVX-512 VNNI): R activation rows times four
weight columns per register tile, 512-bit vectors, for the block-32 "lanes" types (Q8_0, Q4_1, Q5_0,
Q5_1).

Owns: `applies` (which layouts and variants take this path), the tile's scratch (`wide_scratch`),
the activations laid out once per tile (`_lay_out_tile`) and the loops (`wide_tiles`: column chunks,
then tiles of R rows, then quads of columns, then blocks). It does not own the block decoders
(blocks_classic's `PairBlock`s) or the order of any float operation: that is matmul_ir.py's, and
each lane here is one row's own operation on the same operands as the single-row code.

The layout. Two adjacent weight columns a, c of block b are one `PairBlock`: `low` = [a0..15 | c0..15],
`high` = [a16..31 | c16..31]; concatenated they are one <64 x i8> w. A tile's activation row r of
block b is laid out once per tile and chunk as [x0..15 | x0..15 | x16..31 | x16..31] (a stack scratch
[block][row] of 64 bytes each), so one `vpdpbusd` zmm gives [a's lanes 0-3 | c's lanes 0-3 | a's
lanes 4-7 | c's lanes 4-7]: both columns' exact int32 lane sums, each lane the dot8 lane of the
single-row code (integer sums are exact, so grouping is free). Offset types (Q5_0's 16, Q8_0's 128
once its bytes are flipped) start that `vpdpbusd` from -offset * (the activation quad sums), laid out
the same way once per tile. Per block and row, for each column pair:

    acc = fma(D * splat(d_x), float(isum), acc)     D = [d_a x4 | d_c x4 | d_a x4 | d_c x4]

which is, lane for lane, the single-row `fma(d_w * d_x, float(isum), acc)`. Q4_1/Q5_1's minimum term
`accm + m * s` runs with lanes (column j, row r) at j * R + r: [m_j per lane] times [s_r per lane] (the
tile's s laid out [block][row]), then one add. The final sums are the single-row tree
((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7)) + accm on both columns of a pair at once. So every output is
bit for bit what the row alone gives (and what the reference gives), whatever R, M or the threads'
column ranges.

Cost per row, column pair and block: one `vpdpbusd`, one `vmulps` (d_x broadcast from memory), one
`vcvtdq2ps` and one `vfmadd` on 512 bits, that is 64 products, where the 8-row tile of matmul_tiles_ir
spends the same four operations (plus a broadcast and a load) on 256 bits for 32. The weight pair is
decoded once per block and tile and serves R rows; the activations' 64 bytes serve two pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

from kinetic.codegen.cpu.llvm_ir import Function, const_vec, splat
from kinetic.codegen.cpu.matmul_block_ir import CHUNK_BYTES, column_chunks, row_offset
from kinetic.codegen.cpu.quant_blocks import Layout

PAIRS = 2  # column pairs per register tile: R x 4 columns
ROWS = (8, 4)  # the row counts a wide tile takes (R * 2 * PAIRS must fill whole 16-lane vectors)

DECLARATIONS = [
    "declare <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>, <64 x i8>, <64 x i8>)",
    "declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)",
]

SPREAD = const_vec("i32", [*range(16), *range(16), *range(16, 32), *range(16, 32)])  # x -> [lo|lo|hi|hi]
PAIR_SCALES = const_vec("i32", [0] * 4 + [2] * 4 + [0] * 4 + [2] * 4)  # [d_a, m_a, d_c, m_c] -> D


MAX_K = 16384  # the scratch grows with K (32 bytes a value at R = 8): beyond this, matmul_tiles_ir's tiles


def applies(layout: Layout, variant: str, rows: int, k: int) -> bool:
    """Wide tiles serve the block-32 lanes-order types with a pair decoder, on VNNI, for R in ROWS
    and K up to MAX_K (the stack scratch stays under 1 MB)."""
    return (variant == "vnni" and layout.float_order == "lanes" and layout.decode_pair is not None and rows in ROWS
            and k <= MAX_K)


@dataclass(frozen=True)
class Scratch:
    """The tile's stack scratch: activations [block][row] x 64 bytes; for offset types their start
    vectors [block][row] x <16 x i32>; for Q8_1 users the s values [block][row]."""

    rows: int
    x: str
    start: str | None
    s: str | None


def wide_scratch(fn: Function, layout: Layout, variant: str, k: int, rows: int) -> Scratch:
    """Allocate the scratch in the entry block (before any loop)."""
    nb = k // 32
    x = fn.v(f"alloca i8, i64 {rows * nb * 64}, align 64")
    start = fn.v(f"alloca i32, i64 {rows * nb * 16}, align 64") if row_offset(layout, variant) else None
    s = fn.v(f"alloca float, i64 {rows * nb}, align 64") if layout.activation == "q8_1" else None
    return Scratch(rows, x, start, s)


def _lay_out_tile(fn: Function, layout: Layout, variant: str, k: int, first: str, sc: Scratch) -> None:
    """sc.x[b][i] <- row first+i's block b spread [lo|lo|hi|hi]; sc.start[b][i] <- -offset * its quad
    sums in the same lanes; sc.s[b][i] <- its Q8_1 s."""
    nb, off = k // 32, row_offset(layout, variant)
    ones = splat("i8", off if off < 128 else off - 256)

    def body(b: str, _c: list[str]) -> list[str]:
        for i in range(sc.rows):
            r = fn.v(f"add i64 {first}, {i}")
            x = fn.load("<32 x i8>", fn.gep("%xq", fn.v(f"add i64 {fn.v(f'mul i64 {r}, {k}')}, "
                                                         f"{fn.v(f'mul i64 {b}, 32')}")))
            x64 = fn.v(f"shufflevector <32 x i8> {x}, <32 x i8> poison, {SPREAD}")
            at = fn.v(f"add i64 {fn.v(f'mul i64 {b}, {sc.rows}')}, {i}")
            fn.store("<64 x i8>", x64, fn.gep(sc.x, fn.v(f"mul i64 {at}, 64")), 64)
            if sc.start is not None:
                quads = fn.v(f"call <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32> zeroinitializer, "
                             f"<64 x i8> {ones}, <64 x i8> {x64})")
                neg = fn.v(f"sub <16 x i32> zeroinitializer, {quads}")
                fn.store("<16 x i32>", neg, fn.gep(sc.start, fn.v(f"mul i64 {at}, 16"), "i32"), 64)
            if sc.s is not None:
                s = fn.load("float", fn.gep("%xe", fn.v(f"add i64 {fn.v(f'mul i64 {r}, {nb}')}, {b}"), "float"), 4)
                fn.store("float", s, fn.gep(sc.s, at, "float"), 4)
        return []

    fn.loop(0, nb, [], body)


def _weights(fn: Function, layout: Layout, variant: str, cols: list[str],
             b: str) -> tuple[list[str], list[str], list[str]]:
    """Block b of the quad's columns: per pair the <64 x i8> weights and D; per column [d, m] floats."""
    at = fn.v(f"mul i64 {b}, {layout.block_bytes}")
    ptrs = [fn.gep(c, at) for c in cols]
    flip = row_offset(layout, variant) >= 128  # Q8_0: signed bytes read unsigned, 128 taken back
    ws, ds, dm = [], [], []
    for p in range(PAIRS):
        a, c = ptrs[2 * p], ptrs[2 * p + 1]
        pb = layout.decode_pair(fn, a, c)
        w = fn.v(f"shufflevector <32 x i8> {pb.low}, <32 x i8> {pb.high}, {const_vec('i32', range(64))}")
        if pb.signed and flip:
            w = fn.v(f"xor <64 x i8> {w}, {splat('i8', -128)}")
        ws.append(w)
        halves = fn.v(f"shufflevector <2 x half> {fn.load('<2 x half>', a)}, <2 x half> {fn.load('<2 x half>', c)}, "
                      f"{const_vec('i32', range(4))}")
        floats = fn.v(f"fpext <4 x half> {halves} to <4 x float>")  # [d_a, m_a, d_c, m_c]
        ds.append(fn.v(f"shufflevector <4 x float> {floats}, <4 x float> poison, {PAIR_SCALES}"))
        dm.append(floats)
    return ws, ds, dm


def _min_vectors(fn: Function, dm: list[str], rows: int) -> list[str]:
    """<16 x float> vectors of m with lane j * R + r (column j of the quad, row r) holding m_j."""
    both = fn.v(f"shufflevector <4 x float> {dm[0]}, <4 x float> {dm[1]}, {const_vec('i32', range(8))}")
    lanes = [2 * j + 1 for j in range(2 * PAIRS) for _ in range(rows)]  # m_j sits at 2j + 1
    return [fn.v(f"shufflevector <8 x float> {both}, <8 x float> poison, {const_vec('i32', lanes[h:h + 16])}")
            for h in range(0, len(lanes), 16)]


def _block(fn: Function, layout: Layout, variant: str, k: int, first: str, sc: Scratch, cols: list[str],
           b: str, accs: list[str]) -> list[str]:
    """One block for the tile's R rows and the quad's four columns."""
    nb, rows = k // 32, sc.rows
    ws, ds, dm = _weights(fn, layout, variant, cols, b)
    new = []
    for i in range(rows):
        at = fn.v(f"add i64 {fn.v(f'mul i64 {b}, {rows}')}, {i}")
        x = fn.load("<64 x i8>", fn.gep(sc.x, fn.v(f"mul i64 {at}, 64")), 64)
        start = "zeroinitializer"
        if sc.start is not None:
            start = fn.load("<16 x i32>", fn.gep(sc.start, fn.v(f"mul i64 {at}, 16"), "i32"), 64)
        r = fn.v(f"add i64 {first}, {i}")
        dx = fn.load("float", fn.gep("%xd", fn.v(f"add i64 {fn.v(f'mul i64 {r}, {nb}')}, {b}"), "float"), 4)
        dxs = fn.splat_value(16, "float", dx)
        for p in range(PAIRS):
            isum = fn.v(f"call <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32> {start}, <64 x i8> {ws[p]}, "
                        f"<64 x i8> {x})")
            scale = fn.v(f"fmul <16 x float> {ds[p]}, {dxs}")
            lanes = fn.v(f"sitofp <16 x i32> {isum} to <16 x float>")
            new.append(fn.v(f"call <16 x float> @llvm.fma.v16f32(<16 x float> {scale}, <16 x float> {lanes}, "
                            f"<16 x float> {accs[i * PAIRS + p]})"))
    if sc.s is not None:  # accm + m * s, lanes (column j, row r) at j * R + r
        s = fn.load(f"<{rows} x float>", fn.gep(sc.s, fn.v(f"mul i64 {b}, {rows}"), "float"), 4 * rows)
        s16 = fn.v(f"shufflevector <{rows} x float> {s}, <{rows} x float> poison, "
                   f"{const_vec('i32', [j % rows for j in range(16)])}")
        for h, m16 in enumerate(_min_vectors(fn, dm, rows)):
            prod = fn.v(f"fmul <16 x float> {m16}, {s16}")
            new.append(fn.v(f"fadd <16 x float> {accs[rows * PAIRS + h]}, {prod}"))
    return new


def _pick(fn: Function, v: str, n: int, idx: list[int]) -> str:
    return fn.v(f"shufflevector <{n} x float> {v}, <{n} x float> poison, {const_vec('i32', idx)}")


def _store_quad(fn: Function, layout: Layout, first: str, rows: int, cols: list[str], finals: list[str]) -> None:
    """y[first + i, col] for the tile: the single-row tree on both columns of each pair, plus accm."""
    for i in range(rows):
        r = fn.v(f"add i64 {first}, {i}")
        orow = fn.gep("%out", fn.v(f"mul i64 {r}, %ldo"), "float")
        for p in range(PAIRS):
            acc = finals[i * PAIRS + p]  # [a0-3 | c0-3 | a4-7 | c4-7]
            lo, hi = _pick(fn, acc, 16, list(range(8))), _pick(fn, acc, 16, list(range(8, 16)))
            s8 = fn.v(f"fadd <8 x float> {lo}, {hi}")
            t4 = fn.v(f"fadd <4 x float> {_pick(fn, s8, 8, [0, 1, 4, 5])}, {_pick(fn, s8, 8, [2, 3, 6, 7])}")
            y = fn.v(f"fadd <2 x float> {_pick(fn, t4, 4, [0, 2])}, {_pick(fn, t4, 4, [1, 3])}")
            for half in range(2):
                j = 2 * p + half
                e = fn.v(f"extractelement <2 x float> {y}, i64 {half}")
                if layout.has_min:
                    lane = j * rows + i
                    mm = fn.v(f"extractelement <16 x float> {finals[rows * PAIRS + lane // 16]}, i64 {lane % 16}")
                    e = fn.v(f"fadd float {e}, {mm}")
                fn.store("float", e, fn.gep(orow, cols[j], "float"), 4)


def wide_tiles(fn: Function, layout: Layout, variant: str, k: int, sc: Scratch, start: str = "0") -> str:
    """All full tiles of R rows from row `start` on over [n0, n1); returns the first leftover row."""
    nb, rows, width = k // 32, sc.rows, 2 * PAIRS
    rb = nb * layout.block_bytes
    tiles = fn.v(f"udiv i64 {fn.v(f'sub i64 %m, {start}')}, {rows}")
    n_min = rows * width // 16 if layout.has_min else 0

    def chunk_body(c0: str, c1: str) -> None:
        def tile(tt: str, _c: list[str]) -> list[str]:
            first = fn.v(f"add i64 {start}, {fn.v(f'mul i64 {tt}, {rows}')}")
            _lay_out_tile(fn, layout, variant, k, first, sc)

            def quad(q: str, _c2: list[str]) -> list[str]:
                last = fn.v(f"sub i64 {c1}, 1")
                cols = [q]
                for j in range(1, width):  # columns past the chunk repeat its last (same bits stored)
                    n = fn.v(f"add i64 {q}, {j}")
                    cols.append(fn.v(f"select i1 {fn.v(f'icmp slt i64 {n}, {c1}')}, i64 {n}, i64 {last}"))
                wrows = [fn.gep("%w", fn.v(f"mul i64 {c}, {rb}")) for c in cols]
                carried = [("<16 x float>", "zeroinitializer")] * (rows * PAIRS + n_min)
                finals = fn.loop(0, nb, carried, lambda b, accs: _block(fn, layout, variant, k, first, sc, wrows,
                                                                        b, accs))
                _store_quad(fn, layout, first, rows, cols, finals)
                return []

            fn.loop(c0, c1, [], quad, step=width)
            return []

        fn.loop(0, tiles, [], tile)

    column_chunks(fn, max(width, CHUNK_BYTES // rb // width * width), chunk_body)
    return fn.v(f"add i64 {start}, {fn.v(f'mul i64 {tiles}, {rows}')}")
