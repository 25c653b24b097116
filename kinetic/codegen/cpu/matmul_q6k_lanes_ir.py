"""Q6_K prompt tiles on AVX-512 VNNI: 16 activation rows as the 16 lanes of 512-bit vectors, four
weight columns per register tile (the tile loops, the activations' layout and the scaled lane dots:
matmul_k_lanes_ir).

Owns: `applies`, the tile's scratch (`q6k_scratch`), which activations it lays out (`_lay_out_tile`),
the columns' decoded blocks (`_decode_column`) and a quad's loops over the lanes and super-blocks
(`q6k_tiles`). The float order is matmul_ir.py's "lanes" order
(ggml_vec_dot_q6_K_q8_K), which keeps 8 float lanes l per row; here lane l of every row is one
<16 x float> (row r in vector lane r):

    acc_l = fma(d_w * d_x, float(I_l), acc_l)     per super-block, in order
    y     = ((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7))
    I_l   = sum_c sc[2c + l/4] * D(c, l) - 32 * (sc[2l] * xs[2l] + sc[2l+1] * xs[2l+1])

with D(c, l) the dot of the 4 weights 32c + 4l .. + 3 (unsigned, 0..63) with the row's activations
and xs[j] the row's Q8_K sum of 16 activations j (ggml applies the -32 through those sums, which
moves it between lanes: the lanes are ggml's, not only their total). I_l is an exact int32, so how
it is summed is free; each lane's float operations are the single-row code's on the same operands,
so every output is bit for bit the row alone (and the reference), whatever M, tile or threads.

The integer sums, without a reduction across lanes: D(c, l) of 16 rows is one `vpdpbusd` of the
column's weight dword g = 8c + l broadcast (the unsigned operand: quants 0..63) with the tile's
vector g (the signed one: row r's activations 4g..4g+3 in lane r, matmul_k_lanes_ir, not flipped).
|D| <= 4 * 63 * 128 < 2^15, so two chunks' D fit the two words of a dword (D(2p) low, D(2p+1)
high: one 2-source word shuffle) and one `vpdpwssd` against the column's broadcast scale pair
(sc[4p + l/4], sc[4p + 2 + l/4]) adds both products to I_l; the scale is never multiplied by a
vpmulld. The -32 term is one more `vpdpwssd` per lane: the rows' (xs[2l], xs[2l+1]) word pairs
against the column's (-32 sc[2l], -32 sc[2l+1]). Each lane l runs its own loop over the
super-blocks (its fma chain is independent of the other lanes'), so only the quad's four
accumulators live in registers; a chunk's columns are decoded once (matmul_k_lanes_ir) into
quants and META i32 per column and super-block.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.blocks_classic import decode_q6_k
from kinetic.codegen.cpu.llvm_ir import Function, const_vec, splat
from kinetic.codegen.cpu.matmul_k_lanes_ir import (
    COLUMNS,
    ROWS,
    SUPER,
    LaneTiles,
    Scratch,
    bcast,
    dpwssd,
    fma16,
    lane_applies,
    lane_scratch,
    lane_sum_tree,
    lay_out_dx,
    lay_out_quads,
    lay_out_sum16_pairs,
    quad_at,
    scaled_lane_dot,
    type_lane_tiles,
)

BLOCK_BYTES = 210
LANES = 8  # the float lanes of a row in the single-row order
# i32 per column and super-block: the scale pair of chunks 2p, 2p + 1 for lanes 4h .. 4h+3 at
# PAIRS + 2p + h, (-32 sc[2l], -32 sc[2l+1]) at OFFSETS + l, d_w (float bits) at D
PAIRS, OFFSETS, D, META = 0, 8, 16, 24


applies = lane_applies(Q.Q6_K)


def q6k_scratch(fn: Function, k: int) -> Scratch:
    """The scratch (matmul_k_lanes_ir.Scratch): pairs = the 16-bit sums xs[2l], xs[2l+1] (l 0..LANES-1);
    quants 0..63."""
    return lane_scratch(fn, k, BLOCK_BYTES, META, pairs=LANES)


def _lay_out_tile(fn: Function, k: int, first: str, sc: Scratch) -> None:
    """The tile's activations: xi, dx and pairs (each row's 16 Q8_K sums as 8 word pairs, two 8x8
    dword transposes putting pair l of row r in lane r of vector l)."""

    def body(s: str, _c: list[str]) -> list[str]:
        lay_out_quads(fn, k, first, s, sc.xi, flip=False)
        lay_out_dx(fn, k, first, s, sc.dx)
        lay_out_sum16_pairs(fn, k, first, s, sc.pairs)
        return []

    fn.loop(0, k // SUPER, [], body)


def _decode_column(fn: Function, blk: str, quants: str, meta: str) -> None:
    """One column's super-block: its quants 0..63 to `quants` (element order), the rest to `meta`."""
    decoded = decode_q6_k(fn, blk)
    for c, chunk in enumerate(decoded.chunks):
        fn.store("<32 x i8>", chunk.w, fn.gep(quants, 32 * c), 32)
    sc = fn.v(f"sext <16 x i8> {fn.load('<16 x i8>', fn.gep(blk, 192))} to <16 x i16>")
    pair_order = [4 * p + h + 2 * c for p in range(4) for h in range(2) for c in range(2)]
    pairs = fn.v(f"shufflevector <16 x i16> {sc}, <16 x i16> poison, {const_vec('i32', pair_order)}")
    fn.store("<16 x i16>", pairs, meta, 4)
    offsets = fn.v(f"mul <16 x i16> {sc}, {splat('i16', -32)}")  # |32 * sc| <= 4096
    fn.store("<16 x i16>", offsets, fn.gep(meta, OFFSETS, "i32"), 4)
    fn.store("float", decoded.d, fn.gep(meta, D, "i32"), 4)


def _lane_step(fn: Function, k: int, sc: Scratch, slot: str, lane: int, s: str, accs: list[str]) -> list[str]:
    """Super-block s for float lane `lane` of the tile's 16 rows and the quad's columns."""
    first_col = quad_at(fn, k, slot, s)
    quants = fn.gep(sc.quants, fn.v(f"mul i64 {first_col}, {SUPER}"))
    meta = fn.gep(sc.meta, fn.v(f"mul i64 {first_col}, {META}"), "i32")
    xbase = fn.gep(sc.xi, fn.v(f"mul i64 {s}, {64 * ROWS}"), "i32")
    xs = [fn.v(f"bitcast <16 x i32> {fn.load('<16 x i32>', fn.gep(xbase, (8 * c + lane) * ROWS, 'i32'), 64)} "
               f"to <64 x i8>") for c in range(8)]
    pairs = fn.load("<16 x i32>", fn.gep(sc.pairs, fn.v(f"add i64 {fn.v(f'mul i64 {s}, {LANES * ROWS}')}, "
                                                         f"{lane * ROWS}"), "i32"), 64)
    pairs = fn.v(f"bitcast <16 x i32> {pairs} to <32 x i16>")
    dx = fn.load("<16 x float>", fn.gep(sc.dx, fn.v(f"mul i64 {s}, {ROWS}"), "float"), 64)
    new = []
    for col in range(COLUMNS):
        at = col * META
        scale_pairs = [fn.gep(meta, at + PAIRS + 2 * p + lane // 4, "i32") for p in range(4)]
        dots = scaled_lane_dot(fn, xs, fn.gep(quants, col * SUPER), lane, scale_pairs)
        offsets = fn.v(f"bitcast <16 x i32> {bcast(fn, fn.gep(meta, at + OFFSETS + lane, 'i32'))} to <32 x i16>")
        total = dpwssd(fn, dots, pairs, offsets)
        sdx = fn.v(f"fmul <16 x float> {bcast(fn, fn.gep(meta, at + D, 'i32'), 'float')}, {dx}")
        new.append(fma16(fn, sdx, fn.v(f"sitofp <16 x i32> {total} to <16 x float>"), accs[col]))
    return new


def q6k_tiles(fn: Function, k: int, sc: Scratch, start: str = "0") -> str:
    """All full tiles of 16 rows from row `start` on over [n0, n1); returns the first leftover row."""
    nsb = k // SUPER

    def lane_finals(slot: str, lane: int) -> list[str]:
        carried = [("<16 x float>", "zeroinitializer")] * COLUMNS
        return fn.loop(0, nsb, carried, lambda s, accs: _lane_step(fn, k, sc, slot, lane, s, accs))

    def results(slot: str) -> list[str]:
        return lane_sum_tree(fn, lambda lane: lane_finals(slot, lane))

    return type_lane_tiles(fn, k, sc, start, block_bytes=BLOCK_BYTES, meta_words=META,
                           lay_out_tile=lambda first: _lay_out_tile(fn, k, first, sc),
                           decode_column=lambda blk, quants, meta: _decode_column(fn, blk, quants, meta),
                           quad_results=results)


TILES = LaneTiles(applies=applies, scratch=q6k_scratch, tiles=q6k_tiles)
