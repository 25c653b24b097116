"""Q3_K prompt tiles on AVX-512 VNNI: 16 activation rows as the 16 lanes of 512-bit vectors, four
weight columns per register tile (the tile loops, the activations' layout and the scaled lane dots:
matmul_k_lanes_ir; Q6_K's tiles, matmul_q6k_lanes_ir, have the same lanes).

Owns: `applies`, the tile's scratch (`q3k_scratch`), the columns' decoded blocks (`_decode_column`)
and a quad's loops over the lanes and super-blocks (`q3k_tiles`). The float order is matmul_ir.py's
"lanes" order (ggml_vec_dot_q3_K_q8_K): 8 float lanes l per row, here each one <16 x float> (row r
in vector lane r):

    acc_l = fma(d_w * d_x, float(I_l), acc_l)     per super-block, in order
    y     = ((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7))
    I_l   = sum_c sc[2c + l/4] * D(c, l)

with D(c, l) the dot of the signed quants 32c + 4l .. + 3 (-4 .. 3, ggml's "minus 4 unless the hmask
bit is set") with the row's activations, and sc the 16 signed 6-bit scales. The integers are exact,
so how they are summed is free; each lane's float operations are the single-row code's on the same
operands, so every output is bit for bit the row alone (and the reference). The quants being signed,
the activations are flipped to x + 128 and `scaled_lane_dot` gets E = D + 128 * (the 4 quants'
sum) per dword; I_l's chain starts from -128 * sum_c sc[2c + l/4] * (those sums), one integer per
column, super-block and lane computed with the decode.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.blocks_newer import _q3_k_scales, decode_q3_k
from kinetic.codegen.cpu.llvm_ir import Function, const_vec, splat
from kinetic.codegen.cpu.matmul_k_lanes_ir import (
    COLUMNS,
    ROWS,
    SUPER,
    LaneTiles,
    Scratch,
    bcast,
    fma16,
    lane_applies,
    lane_scratch,
    lane_sum_tree,
    lay_out_dx,
    lay_out_quads,
    quad_at,
    scaled_lane_dot,
    type_lane_tiles,
)

BLOCK_BYTES = 110
# i32 per column and super-block: the scale pair of chunks 2p, 2p + 1 for lanes 4h .. 4h+3 at
# PAIRS + 2p + h, lane l's chain start -128 * sum_c sc[2c + l/4] * W(c, l) at START + l, d_w at D
PAIRS, START, D, META = 0, 8, 16, 17


applies = lane_applies(Q.Q3_K)


def q3k_scratch(fn: Function, k: int) -> Scratch:
    """The scratch (matmul_k_lanes_ir.Scratch): xi holds x + 128; no pairs; quants -4 .. 3."""
    return lane_scratch(fn, k, BLOCK_BYTES, META, pairs=0)


def _lay_out_tile(fn: Function, k: int, first: str, sc: Scratch) -> None:
    """The tile's activations: xi (flipped) and dx."""

    def body(s: str, _c: list[str]) -> list[str]:
        lay_out_quads(fn, k, first, s, sc.xi)
        lay_out_dx(fn, k, first, s, sc.dx)
        return []

    fn.loop(0, k // SUPER, [], body)


def _decode_column(fn: Function, blk: str, quants: str, meta: str) -> None:
    """One column's super-block: its quants to `quants` (element order), the rest to `meta`."""
    decoded = decode_q3_k(fn, blk)
    ones = splat("i8", 1)
    start = "zeroinitializer"
    for c, chunk in enumerate(decoded.chunks):
        fn.store("<32 x i8>", chunk.w, fn.gep(quants, 32 * c), 32)
        pairs = fn.v(f"call <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8> {ones}, <32 x i8> {chunk.w})")
        sums = fn.v(f"call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> {pairs}, <16 x i16> {splat('i16', 1)})")
        start = fn.v(f"add <8 x i32> {start}, {fn.v(f'mul <8 x i32> {sums}, {chunk.lane_scale}')}")
    fn.store("<8 x i32>", fn.v(f"mul <8 x i32> {start}, {splat('i32', -128)}"), fn.gep(meta, START, "i32"), 4)
    sc = fn.v(f"sext <16 x i8> {_q3_k_scales(fn, fn.gep(blk, 96))} to <16 x i16>")
    pair_order = [4 * p + h + 2 * c for p in range(4) for h in range(2) for c in range(2)]
    fn.store("<16 x i16>", fn.v(f"shufflevector <16 x i16> {sc}, <16 x i16> poison, {const_vec('i32', pair_order)}"),
             fn.gep(meta, PAIRS, "i32"), 4)
    fn.store("float", decoded.d, fn.gep(meta, D, "i32"), 4)


def _lane_step(fn: Function, k: int, sc: Scratch, slot: str, lane: int, s: str, accs: list[str]) -> list[str]:
    """Super-block s for float lane `lane` of the tile's 16 rows and the quad's columns."""
    first_col = quad_at(fn, k, slot, s)
    quants = fn.gep(sc.quants, fn.v(f"mul i64 {first_col}, {SUPER}"))
    meta = fn.gep(sc.meta, fn.v(f"mul i64 {first_col}, {META}"), "i32")
    xbase = fn.gep(sc.xi, fn.v(f"mul i64 {s}, {64 * ROWS}"), "i32")
    xs = [fn.v(f"bitcast <16 x i32> {fn.load('<16 x i32>', fn.gep(xbase, (8 * c + lane) * ROWS, 'i32'), 64)} "
               f"to <64 x i8>") for c in range(8)]
    dx = fn.load("<16 x float>", fn.gep(sc.dx, fn.v(f"mul i64 {s}, {ROWS}"), "float"), 64)
    new = []
    for col in range(COLUMNS):
        at = col * META
        scale_pairs = [fn.gep(meta, at + PAIRS + 2 * p + lane // 4, "i32") for p in range(4)]
        start = bcast(fn, fn.gep(meta, at + START + lane, "i32"))
        total = scaled_lane_dot(fn, xs, fn.gep(quants, col * SUPER), lane, scale_pairs, signed=True, start=start)
        sdx = fn.v(f"fmul <16 x float> {bcast(fn, fn.gep(meta, at + D, 'i32'), 'float')}, {dx}")
        new.append(fma16(fn, sdx, fn.v(f"sitofp <16 x i32> {total} to <16 x float>"), accs[col]))
    return new


def q3k_tiles(fn: Function, k: int, sc: Scratch, start: str = "0") -> str:
    """All full tiles of 16 rows from row `start` on over [n0, n1); returns the first leftover row."""
    nsb = k // SUPER
    carried = [("<16 x float>", "zeroinitializer")] * COLUMNS

    def results(slot: str) -> list[str]:
        return lane_sum_tree(fn, lambda lane: fn.loop(
            0, nsb, carried, lambda s, accs: _lane_step(fn, k, sc, slot, lane, s, accs)))

    return type_lane_tiles(fn, k, sc, start, block_bytes=BLOCK_BYTES, meta_words=META,
                           lay_out_tile=lambda first: _lay_out_tile(fn, k, first, sc),
                           decode_column=lambda blk, quants, meta: _decode_column(fn, blk, quants, meta),
                           quad_results=results)


TILES = LaneTiles(applies=applies, scratch=q3k_scratch, tiles=q3k_tiles)
