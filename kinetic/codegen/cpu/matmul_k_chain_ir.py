"""Prompt tiles of Q6_K, Q5_K, Q3_K and IQ4_XS in the fast order "block_chain" on AVX-512 VNNI: 16
activation rows as the 16 lanes of 512-bit vectors, four weight columns per register tile (the tile
loops and the activations' layout are matmul_k_lanes_ir's).

Owns: `TILES` (one `LaneTiles` per type), a column's super-block decoded once per column chunk
(`_decode_column`) and a quad's super-block loop (`_super_block`). The float order is matmul_ir.py's
"scalar" order, which `order="block_chain"` builds for these types (kinetic/ir/orders.py), one lane
per row:

    isum = sum_j scale_j * (sub-block j's dot)     exact int32 (Q6_K q - 32; Q3_K, IQ4_XS signed values;
                                                   Q5_K q 0..31; 16 sub-blocks of 16 or 8 of 32)
    acc  = fma(float(isum), d_w * d_x, acc)
    accm = fma(float(imin), dmin * d_x, accm)      Q5_K: imin = sum_j min_j * (sub-block j's x sum)
    y    = acc (Q5_K: acc - accm)

isum and imin are exact int32 (|isum| < 2^29 with every intermediate sum, see _decode_column), so how
they are summed is free; each lane's float operations are the single-row code's (matmul_rows_ir) on
the same operands, so every output is bit for bit the row alone (and the reference), whatever M, the
tile or the threads' columns.

The integer sums, without a reduction across lanes: the tile's rows are laid out once per tile with
super-block bytes 4g..4g+3 of row r in dword r of vector g, flipped to x + 128 (vpdpbusd's unsigned
operand; matmul_k_lanes_ir.lay_out_quads). A column's weights are decoded once per column chunk into
signed bytes (Q6_K's 32 taken off), and `vpdpbusd(acc, x_g, broadcast(weight dword g))` adds to lane r
row r's dot of those 4 weights: a sub-block's dwords go into one accumulator (two chains), which one
`vpmulld` by the broadcast scale adds to isum. The + 128 costs 128 * sum_j scale_j * (sum of sub-block
j's weights), one integer per column and super-block, isum's starting value. This is Q4_K's tile
(matmul_q4k_lanes_ir) for any sub-block size, on the types' shared block decoders (quant_blocks).
"""

from __future__ import annotations

from functools import partial

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.llvm_ir import Function, const_vec, splat
from kinetic.codegen.cpu.matmul_block_ir import decode_block
from kinetic.codegen.cpu.matmul_k_lanes_ir import (
    COLUMNS,
    MAX_K,
    ROWS,
    SUPER,
    LaneTiles,
    Scratch,
    bcast,
    dpbusd,
    dpwssd,
    fma16,
    lane_scratch,
    lay_out_dx,
    lay_out_quads,
    lay_out_sub_block_pairs,
    quad_at,
    type_lane_tiles,
)
from kinetic.codegen.cpu.quant_blocks import LAYOUTS, Layout

TYPES = (Q.Q6_K, Q.Q5_K, Q.Q3_K, Q.IQ4_XS)
SUB_BLOCK = {Q.Q6_K: 16, Q.Q3_K: 16, Q.Q5_K: 32, Q.IQ4_XS: 32}  # values per scale
WEIGHT_OFFSET = {Q.Q6_K: 32}  # stored quants minus this are the weights (ggml applies it through the Q8_K sums)


class _Meta:
    """i32 words per decoded column and super-block: the sub-blocks' scales, isum's starting value
    (-128 * sum_j scale_j * sum of sub-block j's weights), d (f32 bits); Q5_K also its min pairs
    (min_2t, min_2t+1) as words and dmin (f32 bits)."""

    def __init__(self, wtype: Q):
        self.subs = SUPER // SUB_BLOCK[wtype]
        self.start, self.d = self.subs, self.subs + 1
        self.mins, self.dmin = self.subs + 2, self.subs + 6
        self.words = self.subs + (7 if LAYOUTS[wtype].has_min else 2)


def _applies(wtype: Q, layout: Layout, variant: str, tile: int, k: int) -> bool:
    return (layout.wtype is wtype and layout.float_order == "scalar" and layout.dot_order is not None
            and variant == "vnni" and tile >= 8 and k <= MAX_K)


def _scratch(layout: Layout, fn: Function, k: int) -> Scratch:
    """xi holds x + 128; pairs (Q5_K) the 16-bit x sums of sub-blocks 2t, 2t+1 (t 0..3)."""
    return lane_scratch(fn, k, layout.block_bytes, _Meta(layout.wtype).words, pairs=4 if layout.has_min else 0)


def _lay_out_tile(layout: Layout, fn: Function, k: int, first: str, sc: Scratch) -> None:
    def body(s: str, _c: list[str]) -> list[str]:
        lay_out_quads(fn, k, first, s, sc.xi)
        lay_out_dx(fn, k, first, s, sc.dx)
        if layout.has_min:
            lay_out_sub_block_pairs(fn, k, first, s, sc.pairs)
        return []

    fn.loop(0, k // SUPER, [], body)


def _decode_column(layout: Layout, fn: Function, blk: str, quants: str, meta: str) -> None:
    """One column's super-block: its weights as signed bytes to `quants` (element order), the rest to
    `meta` (_Meta). Bounds: a sub-block's dot with x + 128 is at most 32 * 255 * 127 (IQ4_XS), times a
    scale (|scale| <= 128) and summed over the super-block below 2^28, the start below 2^27."""
    m = _Meta(layout.wtype)
    decoded = decode_block(fn, layout, "vnni", blk)
    ones = splat("i8", 1)
    start = "zeroinitializer"
    for c, chunk in enumerate(decoded.chunks):
        w = chunk.w
        if layout.wtype in WEIGHT_OFFSET:
            w = fn.v(f"sub <32 x i8> {w}, {splat('i8', WEIGHT_OFFSET[layout.wtype])}")
        fn.store("<32 x i8>", w, fn.gep(quants, 32 * c), 32)
        pairs = fn.v(f"call <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8> {ones}, <32 x i8> {w})")
        sums = fn.v(f"call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> {pairs}, <16 x i16> {splat('i16', 1)})")
        start = fn.v(f"add <8 x i32> {start}, {fn.v(f'mul <8 x i32> {sums}, {chunk.lane_scale}')}")
    fn.store(f"<{m.subs} x i32>", _sub_block_scales(layout, fn, decoded.chunks), meta, 4)
    total = fn.v(f"call i32 @llvm.vector.reduce.add.v8i32(<8 x i32> {start})")
    fn.store("i32", fn.v(f"mul i32 {total}, -128"), fn.gep(meta, m.start, "i32"), 4)
    fn.store("float", decoded.d, fn.gep(meta, m.d, "i32"), 4)
    if layout.has_min:  # mins: <16 x i32>, min j at 2j and 2j + 1
        mins = fn.v(f"shufflevector <16 x i32> {decoded.mins}, <16 x i32> poison, {const_vec('i32', range(0, 16, 2))}")
        fn.store("<8 x i16>", fn.v(f"trunc <8 x i32> {mins} to <8 x i16>"), fn.gep(meta, m.mins, "i32"), 4)
        fn.store("float", decoded.min_scale, fn.gep(meta, m.dmin, "i32"), 4)


def _sub_block_scales(layout: Layout, fn: Function, chunks: list) -> str:
    """<subs x i32>: sub-block j's scale at j, gathered by shuffles from the chunks' lane scales
    (sub-block j's is lane (j * SUB_BLOCK % 32) / 4 of the chunk holding its first value), two
    vectors at a time, instead of an extract and a store per sub-block."""
    size = SUB_BLOCK[layout.wtype]
    per_chunk = 32 // size  # sub-blocks a chunk of 32 values holds
    vectors = [chunk.lane_scale for chunk in chunks]
    wanted = [[t * size // 4 for t in range(per_chunk)]] * len(vectors)
    width = 8
    while len(vectors) > 1:
        merged = []
        for a, b, wa, wb in zip(vectors[0::2], vectors[1::2], wanted[0::2], wanted[1::2], strict=True):
            mask = const_vec("i32", list(wa) + [width + i for i in wb])
            merged.append(fn.v(f"shufflevector <{width} x i32> {a}, <{width} x i32> {b}, {mask}"))
        width = len(wanted[0]) * 2
        vectors, wanted = merged, [list(range(width))] * len(merged)
    return vectors[0]


def _super_block(layout: Layout, fn: Function, k: int, sc: Scratch, slot: str, s: str, accs: list[str]) -> list[str]:
    """One super-block for the tile's 16 rows and the quad's columns; accs: acc per column (then accm
    per column, Q5_K)."""
    m = _Meta(layout.wtype)
    first_col = quad_at(fn, k, slot, s)
    quants = fn.gep(sc.quants, fn.v(f"mul i64 {first_col}, {SUPER}"))
    meta = fn.gep(sc.meta, fn.v(f"mul i64 {first_col}, {m.words}"), "i32")
    xbase = fn.gep(sc.xi, fn.v(f"mul i64 {s}, {64 * ROWS}"), "i32")
    totals = [bcast(fn, fn.gep(meta, c * m.words + m.start, "i32")) for c in range(COLUMNS)]
    dwords = SUB_BLOCK[layout.wtype] // 4
    for j in range(m.subs):
        chains = [["zeroinitializer"] * 2 for _ in range(COLUMNS)]  # two independent chains per column
        for g in range(dwords * j, dwords * (j + 1)):
            x = fn.v(f"bitcast <16 x i32> {fn.load('<16 x i32>', fn.gep(xbase, g * ROWS, 'i32'), 64)} to <64 x i8>")
            for c in range(COLUMNS):
                w = fn.v(f"bitcast <16 x i32> {bcast(fn, fn.gep(quants, c * SUPER + 4 * g))} to <64 x i8>")
                chains[c][g % 2] = dpbusd(fn, chains[c][g % 2], x, w)
        for c in range(COLUMNS):
            dot = fn.v(f"add <16 x i32> {chains[c][0]}, {chains[c][1]}")
            scale = bcast(fn, fn.gep(meta, c * m.words + j, "i32"))
            totals[c] = fn.v(f"add <16 x i32> {totals[c]}, {fn.v(f'mul <16 x i32> {dot}, {scale}')}")
    dx = fn.load("<16 x float>", fn.gep(sc.dx, fn.v(f"mul i64 {s}, {ROWS}"), "float"), 64)
    ints = [(totals[c], c * m.words + m.d, accs[c]) for c in range(COLUMNS)]
    if layout.has_min:
        pbase = fn.gep(sc.pairs, fn.v(f"mul i64 {s}, {4 * ROWS}"), "i32")
        xsums = [fn.v(f"bitcast <16 x i32> {fn.load('<16 x i32>', fn.gep(pbase, t * ROWS, 'i32'), 64)} to <32 x i16>")
                 for t in range(4)]
        for c in range(COLUMNS):
            imin = "zeroinitializer"
            for t in range(4):
                mins = fn.v(f"bitcast <16 x i32> {bcast(fn, fn.gep(meta, c * m.words + m.mins + t, 'i32'))} "
                            f"to <32 x i16>")
                imin = dpwssd(fn, imin, xsums[t], mins)
            ints.append((imin, c * m.words + m.dmin, accs[COLUMNS + c]))
    new = []
    for value, at, acc in ints:
        sdx = fn.v(f"fmul <16 x float> {bcast(fn, fn.gep(meta, at, 'i32'), 'float')}, {dx}")
        new.append(fma16(fn, fn.v(f"sitofp <16 x i32> {value} to <16 x float>"), sdx, acc))
    return new


def _tiles(layout: Layout, fn: Function, k: int, sc: Scratch, start: str = "0") -> str:
    """All full tiles of 16 rows from row `start` on over [n0, n1); returns the first leftover row."""
    accs = COLUMNS * (2 if layout.has_min else 1)

    def results(slot: str) -> list[str]:
        carried = [("<16 x float>", "zeroinitializer")] * accs
        finals = fn.loop(0, k // SUPER, carried, lambda s, a: _super_block(layout, fn, k, sc, slot, s, a))
        if not layout.has_min:
            return finals
        return [fn.v(f"fsub <16 x float> {finals[c]}, {finals[COLUMNS + c]}") for c in range(COLUMNS)]

    return type_lane_tiles(fn, k, sc, start, block_bytes=layout.block_bytes, meta_words=_Meta(layout.wtype).words,
                           lay_out_tile=lambda first: _lay_out_tile(layout, fn, k, first, sc),
                           decode_column=partial(_decode_column, layout, fn), quad_results=results)


def _type_tiles(wtype: Q) -> LaneTiles:
    layout = LAYOUTS[wtype]
    return LaneTiles(applies=partial(_applies, wtype), scratch=partial(_scratch, layout),
                     tiles=partial(_tiles, layout))


TILES = tuple(_type_tiles(wtype) for wtype in TYPES)
