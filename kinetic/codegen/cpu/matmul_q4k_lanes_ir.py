"""Q4_K prompt tiles on AVX-512 VNNI: 16 activation rows as the 16 lanes of 512-bit vectors, four
weight columns per register tile.

Owns: `applies`, the tile's scratch (`q4k_scratch`), the activations laid out once per tile and
column chunk (`_lay_out_tile`), the columns' decoded blocks (`_decode_column`) and a quad's
super-block loop (`q4k_tiles`; the tile loops are matmul_k_lanes_ir's, shared with Q6_K). The
float order is matmul_ir.py's "scalar" order (ggml_gemv_q4_K_8x8_q8_K), one lane per row:

    acc  = fma(float(iacc), d_w * d_x, acc)        iacc = sum_j scale_j * (sub-block j's dot)
    accm = fma(float(imin), dmin * d_x, accm)      imin = sum_j min_j * (sub-block j's x sum)
    y    = acc - accm

iacc and imin are exact int32 (|iacc| < 8 * 63 * 32 * 15 * 127 < 2^31), so how they are summed is
free; each lane's float operations are the single-row code's on the same operands, so every output
is bit for bit the row alone (and the reference), whatever M, the tile or the threads' columns.

The integer sums, without a reduction across lanes: row r's super-block is laid out once per tile
with its bytes 4g..4g+3 in dword r of vector g (64 vectors, `_lay_out_tile`), flipped to unsigned
(x + 128). The quad's columns are decoded (quants 0..15) into a scratch once per column chunk, in a
loop of their own (in the block loop LLVM would forward the stores into registers and broadcast from
there), and `vpdpbusd(acc, x_g, broadcast(weight dword g))` adds to lane r row r's dot of those 4
weights: 8 per sub-block, 64 per super-block for 16 rows, the broadcast folded into the instruction
(`{1to16}`). The + 128 costs 128 * sum_j scale_j * (sum of sub-block j's quants), one integer per
column and super-block, taken back once. imin uses `vpdpwssd` on (x sum of sub-block 2t, 2t+1) as
16-bit pairs per lane (|sum| <= 32 * 127) against the column's (min_2t, min_2t+1) broadcast: 4 per
super-block.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.blocks_classic import _k4_scales
from kinetic.codegen.cpu.llvm_ir import Function, const_vec, splat
from kinetic.codegen.cpu.matmul_k_lanes_ir import (
    COLUMNS,
    ROWS,
    SUPER,
    LaneTiles,
    Scratch,
    bcast,
    lane_applies,
    lane_scratch,
    lay_out_dx,
    lay_out_quads,
    lay_out_sub_block_pairs,
    quad_at,
    type_lane_tiles,
)

BLOCK_BYTES = 144


applies = lane_applies(Q.Q4_K)


def q4k_scratch(fn: Function, k: int) -> Scratch:
    """The scratch (matmul_k_lanes_ir.Scratch): xi holds x + 128;
    pairs = the 16-bit x sums of sub-blocks 2t, 2t+1 (t 0..3)."""
    return lane_scratch(fn, k, BLOCK_BYTES, META, pairs=4)


def _lay_out_tile(fn: Function, k: int, first: str, sc: Scratch) -> None:
    """The tile's activations: xi, dx and pairs (the 16-bit sums of sub-blocks 2t, 2t+1 per row)."""

    def body(s: str, _c: list[str]) -> list[str]:
        lay_out_quads(fn, k, first, s, sc.xi)
        lay_out_dx(fn, k, first, s, sc.dx)
        lay_out_sub_block_pairs(fn, k, first, s, sc.pairs)
        return []

    fn.loop(0, k // SUPER, [], body)


META = 16  # i32 per column and super-block: scales 0..7, (min_2t, min_2t+1) at 8 + t, correction 12, d 13, dmin 14


def _decode_column(fn: Function, blk: str, quants: str, meta: str) -> None:
    """One column's super-block: its quants to `quants` (sub-block j at 32j), the rest to `meta`: the
    scales, the 16-bit min pairs, -128 * sum_j scale_j * sum(quants_j), and d, dmin as float bits."""
    sm = _k4_scales(fn, fn.gep(blk, 4))  # 8 scales, then 8 mins
    s16 = fn.v(f"zext <16 x i8> {sm} to <16 x i16>")
    total = "zeroinitializer"
    for p in range(4):
        raw = fn.load("<32 x i8>", fn.gep(blk, 16 + 32 * p))
        for half, w in enumerate((fn.v(f"and <32 x i8> {raw}, {splat('i8', 15)}"),
                                  fn.v(f"lshr <32 x i8> {raw}, {splat('i8', 4)}"))):
            j = 2 * p + half
            fn.store("<32 x i8>", w, fn.gep(quants, 32 * j), 32)
            pair = fn.v(f"call <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8> {w}, <32 x i8> {splat('i8', 1)})")
            scale = fn.v(f"shufflevector <16 x i16> {s16}, <16 x i16> poison, {const_vec('i32', [j] * 16)}")
            prod = fn.v(f"call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> {pair}, <16 x i16> {scale})")
            total = fn.v(f"add <8 x i32> {total}, {prod}")
    weighted = fn.v(f"call i32 @llvm.vector.reduce.add.v8i32(<8 x i32> {total})")
    first8 = fn.v(f"shufflevector <16 x i8> {sm}, <16 x i8> poison, {const_vec('i32', range(8))}")
    scales = fn.v(f"zext <8 x i8> {first8} to <8 x i32>")
    fn.store("<8 x i32>", scales, meta, 32)
    mins = fn.v(f"shufflevector <16 x i16> {s16}, <16 x i16> poison, {const_vec('i32', range(8, 16))}")
    fn.store("<8 x i16>", mins, fn.gep(meta, 8, "i32"), 16)  # dword 8 + t = (min_2t, min_2t+1)
    fn.store("i32", fn.v(f"mul i32 {weighted}, -128"), fn.gep(meta, 12, "i32"), 4)
    dd = fn.v(f"fpext <2 x half> {fn.load('<2 x half>', blk)} to <2 x float>")
    fn.store("<2 x float>", dd, fn.gep(meta, 13, "i32"), 4)


def _super_block(fn: Function, k: int, sc: Scratch, slot: str, s: str, accs: list[str]) -> list[str]:
    """One super-block for the tile's 16 rows and the quad's columns; accs: acc per column, accm per column."""
    first_col = quad_at(fn, k, slot, s)
    quants = fn.gep(sc.quants, fn.v(f"mul i64 {first_col}, {SUPER}"))
    meta = fn.gep(sc.meta, fn.v(f"mul i64 {first_col}, {META}"), "i32")
    xbase = fn.gep(sc.xi, fn.v(f"mul i64 {s}, {64 * ROWS}"), "i32")
    totals = [bcast(fn, fn.gep(meta, c * META + 12, "i32")) for c in range(COLUMNS)]
    for j in range(8):
        chains = [["zeroinitializer"] * 2 for _ in range(COLUMNS)]
        for g in range(8):
            x = fn.v(f"bitcast <16 x i32> {fn.load('<16 x i32>', fn.gep(xbase, (8 * j + g) * ROWS, 'i32'), 64)} "
                     f"to <64 x i8>")
            for c in range(COLUMNS):
                w = fn.v(f"bitcast <16 x i32> {bcast(fn, fn.gep(quants, c * SUPER + 32 * j + 4 * g))} to <64 x i8>")
                chains[c][g % 2] = fn.v(f"call <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32> {chains[c][g % 2]}, "
                                        f"<64 x i8> {x}, <64 x i8> {w})")
        for c in range(COLUMNS):
            dot = fn.v(f"add <16 x i32> {chains[c][0]}, {chains[c][1]}")
            scale = bcast(fn, fn.gep(meta, c * META + j, "i32"))
            totals[c] = fn.v(f"add <16 x i32> {totals[c]}, {fn.v(f'mul <16 x i32> {dot}, {scale}')}")
    pbase = fn.gep(sc.pairs, fn.v(f"mul i64 {s}, {4 * ROWS}"), "i32")
    xsums = [fn.v(f"bitcast <16 x i32> {fn.load('<16 x i32>', fn.gep(pbase, t * ROWS, 'i32'), 64)} to <32 x i16>")
             for t in range(4)]
    dx = fn.load("<16 x float>", fn.gep(sc.dx, fn.v(f"mul i64 {s}, {ROWS}"), "float"), 64)
    new_acc, new_min = [], []
    for c in range(COLUMNS):
        imin = "zeroinitializer"
        for t in range(4):
            mins = fn.v(f"bitcast <16 x i32> {bcast(fn, fn.gep(meta, c * META + 8 + t, 'i32'))} to <32 x i16>")
            imin = fn.v(f"call <16 x i32> @llvm.x86.avx512.vpdpwssd.512(<16 x i32> {imin}, <32 x i16> {xsums[t]}, "
                        f"<32 x i16> {mins})")
        for value, at, acc, out in ((totals[c], 13, accs[c], new_acc), (imin, 14, accs[COLUMNS + c], new_min)):
            f = fn.v(f"sitofp <16 x i32> {value} to <16 x float>")
            scale = bcast(fn, fn.gep(meta, c * META + at, "i32"), "float")
            sdx = fn.v(f"fmul <16 x float> {scale}, {dx}")
            out.append(fn.v(f"call <16 x float> @llvm.fma.v16f32(<16 x float> {f}, <16 x float> {sdx}, "
                            f"<16 x float> {acc})"))
    return new_acc + new_min


def q4k_tiles(fn: Function, k: int, sc: Scratch, start: str = "0") -> str:
    """All full tiles of 16 rows from row `start` on over [n0, n1); returns the first leftover row."""
    nsb = k // SUPER

    def results(slot: str) -> list[str]:
        carried = [("<16 x float>", "zeroinitializer")] * (2 * COLUMNS)
        finals = fn.loop(0, nsb, carried, lambda s, accs: _super_block(fn, k, sc, slot, s, accs))
        return [fn.v(f"fsub <16 x float> {finals[c]}, {finals[COLUMNS + c]}") for c in range(COLUMNS)]

    return type_lane_tiles(fn, k, sc, start, block_bytes=BLOCK_BYTES, meta_words=META,
                           lay_out_tile=lambda first: _lay_out_tile(fn, k, first, sc),
                           decode_column=lambda blk, quants, meta: _decode_column(fn, blk, quants, meta),
                           quad_results=results)


TILES = LaneTiles(applies=applies, scratch=q4k_scratch, tiles=q4k_tiles)
