"""Q2_K prompt tiles on AVX-512 VNNI: 16 activation rows as the 16 lanes of 512-bit vectors, four
weight columns per register tile (the tile loops and the activations' layout: matmul_k_lanes_ir).

Owns: `applies`, the tile's scratch (`q2k_scratch`), the columns' decoded blocks (`_decode_column`)
and a quad's super-block loop (`q2k_tiles`). The float order is matmul_ir.py's "scalar" order
(ggml_gemv_q2_K_8x8_q8_K), one lane per row:

    acc  = fma(float(iacc), d_w * d_x, acc)        iacc = sum_j scale_j * (group j's dot)
    accm = fma(float(imin), dmin * d_x, accm)      imin = sum_j min_j * (group j's x sum)
    y    = acc - accm

over the 16 groups j of 16 values (4-bit scales and mins, 2-bit quants 0..3). iacc and imin are
exact int32, so how they are summed is free; each lane's float operations are the single-row code's
on the same operands, so every output is bit for bit the row alone (and the reference).

The integer sums, without a reduction across lanes: group j's dot of 16 rows is a chain of 4
`vpdpbusd(acc, broadcast quants 4g..4g+3 (unsigned), x_g (signed, row r in lane r))`, at most
16 * 3 * 128 < 2^15, so groups 2p, 2p + 1 share a dword as words and one `vpdpwssd` against the
column's broadcast (scale_2p, scale_2p+1) adds both scaled dots: 64 + 8 per super-block for 16
rows. imin is 8 `vpdpwssd` of the rows' Q8_K sums (2p, 2p + 1) as word pairs against the column's
(min_2p, min_2p+1).
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.blocks_newer import decode_q2_k
from kinetic.codegen.cpu.llvm_ir import Function, splat
from kinetic.codegen.cpu.matmul_k_lanes_ir import (
    COLUMNS,
    ROWS,
    SUPER,
    LaneTiles,
    Scratch,
    bcast,
    dpbusd,
    dpwssd,
    fma16,
    lane_applies,
    lane_scratch,
    lay_out_dx,
    lay_out_quads,
    lay_out_sum16_pairs,
    quad_at,
    type_lane_tiles,
)

BLOCK_BYTES = 84
# i32 per column and super-block: word pairs (scale_2p, scale_2p+1) at SCALES + p, (min_2p,
# min_2p+1) at MINS + p, d_w and dmin (float bits) at D, D + 1
SCALES, MINS, D, META = 0, 8, 16, 18


applies = lane_applies(Q.Q2_K)


def q2k_scratch(fn: Function, k: int) -> Scratch:
    """The scratch (matmul_k_lanes_ir.Scratch): pairs = the Q8_K sums 2p, 2p + 1 as words (p 0..7);
    quants 0..3."""
    return lane_scratch(fn, k, BLOCK_BYTES, META, pairs=8)


def _lay_out_tile(fn: Function, k: int, first: str, sc: Scratch) -> None:
    """The tile's activations: xi (signed), dx and the Q8_K sum pairs."""

    def body(s: str, _c: list[str]) -> list[str]:
        lay_out_quads(fn, k, first, s, sc.xi, flip=False)
        lay_out_dx(fn, k, first, s, sc.dx)
        lay_out_sum16_pairs(fn, k, first, s, sc.pairs)
        return []

    fn.loop(0, k // SUPER, [], body)


def _decode_column(fn: Function, blk: str, quants: str, meta: str) -> None:
    """One column's super-block: its quants 0..3 to `quants` (element order), the rest to `meta`."""
    for c, chunk in enumerate(decode_q2_k(fn, blk).chunks):
        fn.store("<32 x i8>", chunk.w, fn.gep(quants, 32 * c), 32)
    packed = fn.load("<16 x i8>", blk)  # scale | min << 4 per group
    low = fn.v(f"and <16 x i8> {packed}, {splat('i8', 15)}")
    high = fn.v(f"lshr <16 x i8> {packed}, {splat('i8', 4)}")
    scales = fn.v(f"zext <16 x i8> {low} to <16 x i16>")
    mins = fn.v(f"zext <16 x i8> {high} to <16 x i16>")
    fn.store("<16 x i16>", scales, fn.gep(meta, SCALES, "i32"), 4)
    fn.store("<16 x i16>", mins, fn.gep(meta, MINS, "i32"), 4)
    dd = fn.v(f"fpext <2 x half> {fn.load('<2 x half>', fn.gep(blk, 80))} to <2 x float>")
    fn.store("<2 x float>", dd, fn.gep(meta, D, "i32"), 4)


def _super_block(fn: Function, k: int, sc: Scratch, slot: str, s: str, accs: list[str]) -> list[str]:
    """One super-block for the tile's 16 rows and the quad's columns; accs: acc per column, accm per column."""
    first_col = quad_at(fn, k, slot, s)
    quants = fn.gep(sc.quants, fn.v(f"mul i64 {first_col}, {SUPER}"))
    meta = fn.gep(sc.meta, fn.v(f"mul i64 {first_col}, {META}"), "i32")
    xbase = fn.gep(sc.xi, fn.v(f"mul i64 {s}, {64 * ROWS}"), "i32")
    pbase = fn.gep(sc.pairs, fn.v(f"mul i64 {s}, {8 * ROWS}"), "i32")
    dx = fn.load("<16 x float>", fn.gep(sc.dx, fn.v(f"mul i64 {s}, {ROWS}"), "float"), 64)
    iacc = ["zeroinitializer"] * COLUMNS
    imin = ["zeroinitializer"] * COLUMNS
    for p in range(8):  # groups 2p, 2p + 1
        dots = [["zeroinitializer"] * 2 for _ in range(COLUMNS)]
        for half in range(2):
            for g in range(8 * p + 4 * half, 8 * p + 4 * half + 4):
                x = fn.v(f"bitcast <16 x i32> {fn.load('<16 x i32>', fn.gep(xbase, g * ROWS, 'i32'), 64)} to <64 x i8>")
                for col in range(COLUMNS):
                    w = fn.v(f"bitcast <16 x i32> {bcast(fn, fn.gep(quants, col * SUPER + 4 * g))} to <64 x i8>")
                    dots[col][half] = dpbusd(fn, dots[col][half], w, x)
        xsums = fn.v(f"bitcast <16 x i32> {fn.load('<16 x i32>', fn.gep(pbase, p * ROWS, 'i32'), 64)} to <32 x i16>")
        for col in range(COLUMNS):
            low = fn.v(f"and <16 x i32> {dots[col][0]}, {splat('i32', 65535)}")
            high = fn.v(f"shl <16 x i32> {dots[col][1]}, {splat('i32', 16)}")
            packed = fn.v(f"bitcast <16 x i32> {fn.v(f'or <16 x i32> {low}, {high}')} to <32 x i16>")
            scale = fn.v(f"bitcast <16 x i32> {bcast(fn, fn.gep(meta, col * META + SCALES + p, 'i32'))} to <32 x i16>")
            iacc[col] = dpwssd(fn, iacc[col], packed, scale)
            mins = fn.v(f"bitcast <16 x i32> {bcast(fn, fn.gep(meta, col * META + MINS + p, 'i32'))} to <32 x i16>")
            imin[col] = dpwssd(fn, imin[col], xsums, mins)
    new_acc, new_min = [], []
    for col in range(COLUMNS):
        terms = ((iacc[col], D, accs[col], new_acc), (imin[col], D + 1, accs[COLUMNS + col], new_min))
        for value, at, acc, out in terms:
            f = fn.v(f"sitofp <16 x i32> {value} to <16 x float>")
            sdx = fn.v(f"fmul <16 x float> {bcast(fn, fn.gep(meta, col * META + at, 'i32'), 'float')}, {dx}")
            out.append(fma16(fn, f, sdx, acc))
    return new_acc + new_min


def q2k_tiles(fn: Function, k: int, sc: Scratch, start: str = "0") -> str:
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


TILES = LaneTiles(applies=applies, scratch=q2k_scratch, tiles=q2k_tiles)
