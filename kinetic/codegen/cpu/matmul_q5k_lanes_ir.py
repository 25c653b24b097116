"""Q5_K prompt tiles on AVX-512 VNNI: 16 activation rows as the 16 lanes of 512-bit vectors, four
weight columns per register tile (the tile loops, the activations' layout and the scaled lane dots:
matmul_k_lanes_ir; Q6_K's tiles, matmul_q6k_lanes_ir, have the same structure).

Owns: `applies`, the tile's scratch (`q5k_scratch`), the columns' decoded blocks (`_decode_column`)
and a quad's loops over the lanes, the minimum and the super-blocks (`q5k_tiles`). The float order
is matmul_ir.py's "lanes" order (ggml_vec_dot_q5_K_q8_K): 8 float lanes l per row and one scalar
minimum, here each one <16 x float> (row r in vector lane r):

    acc_l = fma(d_w * d_x, float(I_l), acc_l)                 per super-block, in order
    accm  = fma(-(dmin * d_x), float(imin), accm)             per super-block, in order
    y     = (((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7))) + accm
    I_l   = sum_c sc_c * D(c, l),    imin = sum_j min_j * (the row's sum of sub-block j)

with D(c, l) the dot of the 5-bit quants 32c + 4l .. + 3 (0..31) with the row's activations. The
integers are exact, so how they are summed is free; each lane's float operations are the single-row
code's on the same operands, so every output is bit for bit the row alone (and the reference).
I_l is `scaled_lane_dot` (8 vpdpbusd, two chunks' D per dword as words, 4 vpdpwssd against the
broadcast scale pairs (sc_2p, sc_2p+1)); imin is 4 vpdpwssd of the rows' sub-block sums (2t, 2t+1)
as word pairs against the column's (min_2t, min_2t+1), as in Q4_K's tiles.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.blocks_classic import _k4_scales, decode_q5_k
from kinetic.codegen.cpu.llvm_ir import Function
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
    lay_out_sub_block_pairs,
    quad_at,
    scaled_lane_dot,
    type_lane_tiles,
)

BLOCK_BYTES = 176
# i32 per column and super-block: word pairs (sc_2p, sc_2p+1) at PAIRS + p, (min_2t, min_2t+1) at
# MINS + t, d_w and dmin (float bits) at D, D + 1
PAIRS, MINS, D, META = 0, 4, 8, 10


applies = lane_applies(Q.Q5_K)


def q5k_scratch(fn: Function, k: int) -> Scratch:
    """The scratch (matmul_k_lanes_ir.Scratch): pairs = the 16-bit sums of sub-blocks 2t, 2t+1 (t 0..3);
    quants 0..31."""
    return lane_scratch(fn, k, BLOCK_BYTES, META, pairs=4)


def _lay_out_tile(fn: Function, k: int, first: str, sc: Scratch) -> None:
    """The tile's activations: xi (signed), dx and the sub-block sum pairs."""

    def body(s: str, _c: list[str]) -> list[str]:
        lay_out_quads(fn, k, first, s, sc.xi, flip=False)
        lay_out_dx(fn, k, first, s, sc.dx)
        lay_out_sub_block_pairs(fn, k, first, s, sc.pairs)
        return []

    fn.loop(0, k // SUPER, [], body)


def _decode_column(fn: Function, blk: str, quants: str, meta: str) -> None:
    """One column's super-block: its quants 0..31 to `quants` (element order), the rest to `meta`."""
    decoded = decode_q5_k(fn, blk)
    for c, chunk in enumerate(decoded.chunks):
        fn.store("<32 x i8>", chunk.w, fn.gep(quants, 32 * c), 32)
    words = fn.v(f"zext <16 x i8> {_k4_scales(fn, fn.gep(blk, 4))} to <16 x i16>")  # 8 scales, 8 mins
    fn.store("<16 x i16>", words, fn.gep(meta, PAIRS, "i32"), 4)  # dword p: (sc_2p, sc_2p+1); 4 + t: mins
    dd = fn.v(f"fpext <2 x half> {fn.load('<2 x half>', blk)} to <2 x float>")
    fn.store("<2 x float>", dd, fn.gep(meta, D, "i32"), 4)


def _scratch_at(fn: Function, k: int, sc: Scratch, slot: str, s: str) -> tuple[str, str, str]:
    """(quants, meta, dx) of super-block s: the quad's first column's and the tile's rows'."""
    first_col = quad_at(fn, k, slot, s)
    quants = fn.gep(sc.quants, fn.v(f"mul i64 {first_col}, {SUPER}"))
    meta = fn.gep(sc.meta, fn.v(f"mul i64 {first_col}, {META}"), "i32")
    dx = fn.load("<16 x float>", fn.gep(sc.dx, fn.v(f"mul i64 {s}, {ROWS}"), "float"), 64)
    return quants, meta, dx


def _lane_step(fn: Function, k: int, sc: Scratch, slot: str, lane: int, s: str, accs: list[str]) -> list[str]:
    """Super-block s for float lane `lane` of the tile's 16 rows and the quad's columns."""
    quants, meta, dx = _scratch_at(fn, k, sc, slot, s)
    xbase = fn.gep(sc.xi, fn.v(f"mul i64 {s}, {64 * ROWS}"), "i32")
    xs = [fn.v(f"bitcast <16 x i32> {fn.load('<16 x i32>', fn.gep(xbase, (8 * c + lane) * ROWS, 'i32'), 64)} "
               f"to <64 x i8>") for c in range(8)]
    new = []
    for col in range(COLUMNS):
        scale_pairs = [fn.gep(meta, col * META + PAIRS + p, "i32") for p in range(4)]
        total = scaled_lane_dot(fn, xs, fn.gep(quants, col * SUPER), lane, scale_pairs)
        sdx = fn.v(f"fmul <16 x float> {bcast(fn, fn.gep(meta, col * META + D, 'i32'), 'float')}, {dx}")
        new.append(fma16(fn, sdx, fn.v(f"sitofp <16 x i32> {total} to <16 x float>"), accs[col]))
    return new


def _min_step(fn: Function, k: int, sc: Scratch, slot: str, s: str, accm: list[str]) -> list[str]:
    """Super-block s's minimum term for the tile's 16 rows and the quad's columns."""
    _quants, meta, dx = _scratch_at(fn, k, sc, slot, s)
    pbase = fn.gep(sc.pairs, fn.v(f"mul i64 {s}, {4 * ROWS}"), "i32")
    xsums = [fn.v(f"bitcast <16 x i32> {fn.load('<16 x i32>', fn.gep(pbase, t * ROWS, 'i32'), 64)} to <32 x i16>")
             for t in range(4)]
    new = []
    for col in range(COLUMNS):
        imin = "zeroinitializer"
        for t in range(4):
            mins = fn.v(f"bitcast <16 x i32> {bcast(fn, fn.gep(meta, col * META + MINS + t, 'i32'))} to <32 x i16>")
            imin = dpwssd(fn, imin, xsums[t], mins)
        dmin = bcast(fn, fn.gep(meta, col * META + D + 1, "i32"), "float")
        neg = fn.v(f"fneg <16 x float> {fn.v(f'fmul <16 x float> {dmin}, {dx}')}")
        new.append(fma16(fn, neg, fn.v(f"sitofp <16 x i32> {imin} to <16 x float>"), accm[col]))
    return new


def q5k_tiles(fn: Function, k: int, sc: Scratch, start: str = "0") -> str:
    """All full tiles of 16 rows from row `start` on over [n0, n1); returns the first leftover row."""
    nsb = k // SUPER
    carried = [("<16 x float>", "zeroinitializer")] * COLUMNS

    def results(slot: str) -> list[str]:
        lanes = lane_sum_tree(fn, lambda lane: fn.loop(
            0, nsb, carried, lambda s, accs: _lane_step(fn, k, sc, slot, lane, s, accs)))
        accm = fn.loop(0, nsb, carried, lambda s, accs: _min_step(fn, k, sc, slot, s, accs))
        return [fn.v(f"fadd <16 x float> {y}, {m}") for y, m in zip(lanes, accm, strict=True)]

    return type_lane_tiles(fn, k, sc, start, block_bytes=BLOCK_BYTES, meta_words=META,
                           lay_out_tile=lambda first: _lay_out_tile(fn, k, first, sc),
                           decode_column=lambda blk, quants, meta: _decode_column(fn, blk, quants, meta),
                           quad_results=results)


TILES = LaneTiles(applies=applies, scratch=q5k_scratch, tiles=q5k_tiles)
