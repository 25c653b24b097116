"""Prompt tiles of Q8_0, Q4_1, Q5_0 and Q5_1 in the "block_chain" order on AVX-512 VNNI: 16 activation
rows as the 16 lanes of 512-bit vectors, four weight columns per register tile.

Owns: `TILES` (one `LaneTiles` per type: `applies`, the scratch, the tiles), the activations laid out
once per tile and column chunk (`_lay_out_tile`), a quad's blocks decoded once per column chunk
(`_decode_quad`) and a quad's block loop (`_block`). The tile, chunk and quad loops are
matmul_k_lanes_ir's (`lane_tiles`, with blocks of 32). The float order is matmul_ir.py's "scalar"
order extended to these types (orders.py's "block_chain"), one lane per row:

    isum = sum_i wq[i] * xq[i]                   exact int32 (Q5_0: q - 16, Q8_0: q, Q4_1 / Q5_1: q)
    acc  = fma(float(isum), d_w * d_x, acc)
    accm = fma(m_w, s_x, accm)                   (Q4_1, Q5_1; y = acc + accm at the end)

Each lane's float operations are the single-row code's (matmul_columns_ir.column_quads) on the same
operands, so every output is bit for bit the row alone, whatever M, the tile or the threads' columns.

The integer sums, without a reduction across lanes: each tile row's block b is laid out with its
bytes 4g..4g+3 in dword r of vector g (8 vectors a block), as they are (signed). The quad's columns
are decoded once per column chunk into a scratch as unsigned bytes u (Q4_1's and Q5_1's q, Q5_0's
q = w + 16, Q8_0's w + 128: u = w + offset), so that `vpdpbusd(acc, broadcast(weight dword g), x_g)`
(weights the unsigned operand, in a register) adds to lane r row r's dot of u with those 4 values:
8 per block and column for 16 rows, starting from -offset * (the row's block sum), laid out with the
tile once for every column. The weights' offset thus costs nothing per column, and a column's
decode only unpacks its quants and scales (this matters most for a row split share of 16 rows,
kinetic/codegen/cpu/step.py, where every call decodes every column for one tile: 44 % more time
than 128 rows' tiles took a row when the decode also summed each column's weights). Per block and
column: 8 broadcasts and `vpdpbusd`, one add, one convert, one multiply, one or two fmas for 512
products (matmul_wide_ir's 512-bit tiles spend 4 operations on 64).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from kinetic.codegen.cpu.llvm_ir import Function, const_vec, splat
from kinetic.codegen.cpu.matmul_k_lanes_ir import (
    COLUMNS,
    MAX_K,
    ROWS,
    LaneTiles,
    bcast,
    chunk_columns,
    dpbusd,
    fma16,
    lane_tiles,
    quad_at,
    vector,
)
from kinetic.codegen.cpu.matmul_tiles_ir import transpose8
from kinetic.codegen.cpu.quant_blocks import LAYOUTS, Layout
from kinetic.codegen.cpu.target import FAST_CHAIN_KERNELS

BLOCK = 32
META = 2  # i32 per decoded column and block: d and m (f32 bits)
TYPES = tuple(sorted(t for t in FAST_CHAIN_KERNELS if LAYOUTS[t].block == BLOCK))  # Q8_0, Q4_1, Q5_0, Q5_1


@dataclass(frozen=True)
class Scratch:
    """The tile's stack scratch, allocated in the kernel's entry block: xi [block][g 0..7][16 rows]
    i32 (the activation bytes); xcorr [block][16 rows] i32 (-offset * the row's block sum; None
    without an offset); dx, sx [block][16 rows] f32 (the rows' d and Q8_1 s); a chunk's columns
    decoded [slot][block][column]: quants 32 unsigned bytes each, and meta [slot][block] by field:
    the quad's 4 d, then its 4 m."""

    xi: str
    xcorr: str | None
    dx: str
    sx: str | None
    quants: str
    meta: str


def _applies(wtype, layout: Layout, variant: str, tile: int, k: int) -> bool:
    return (layout.wtype is wtype and layout.float_order == "scalar" and variant == "vnni" and tile >= 8
            and k <= MAX_K)


def _chunk(layout: Layout, k: int) -> int:
    return chunk_columns(k, layout.block_bytes, BLOCK + 4 * META, BLOCK)


def _scratch(layout: Layout, fn: Function, k: int) -> Scratch:
    nb = k // BLOCK
    slots = _chunk(layout, k) // COLUMNS
    sx = fn.v(f"alloca float, i64 {nb * ROWS}, align 64") if layout.has_min else None
    xcorr = fn.v(f"alloca i32, i64 {nb * ROWS}, align 64") if layout.offset else None
    return Scratch(fn.v(f"alloca i32, i64 {nb * 8 * ROWS}, align 64"), xcorr,
                   fn.v(f"alloca float, i64 {nb * ROWS}, align 64"), sx,
                   fn.v(f"alloca i8, i64 {slots * nb * COLUMNS * BLOCK}, align 64"),
                   fn.v(f"alloca i32, i64 {slots * nb * COLUMNS * META}, align 64"))


def _row_floats(fn: Function, src: str, k: int, first: str, b: str, dst: str) -> None:
    """dst[b][row] f32 <- src[first + row][b] (a per-block float of the tile's rows)."""
    values = []
    for i in range(ROWS):
        r = fn.v(f"add i64 {first}, {i}")
        at = fn.v(f"add i64 {fn.v(f'mul i64 {r}, {k // BLOCK}')}, {b}")
        values.append(fn.load("float", fn.gep(src, at, "float"), 4))
    fn.store("<16 x float>", vector(fn, "float", values), fn.gep(dst, fn.v(f"mul i64 {b}, {ROWS}"), "float"), 64)


def _lay_out_tile(layout: Layout, fn: Function, k: int, first: str, sc: Scratch) -> None:
    """xi, xcorr, dx and sx of the tile's 16 rows, block by block: two 8x8 dword transposes a block."""

    def body(b: str, _c: list[str]) -> list[str]:
        for half in range(2):
            rows = []
            for i in range(8):
                r = fn.v(f"add i64 {first}, {8 * half + i}")
                at = fn.v(f"add i64 {fn.v(f'mul i64 {r}, {k}')}, {fn.v(f'mul i64 {b}, {BLOCK}')}")
                rows.append(fn.v(f"bitcast <32 x i8> {fn.load('<32 x i8>', fn.gep('%xq', at))} to <8 x i32>"))
            sums = "zeroinitializer"  # lane i: row 8 * half + i's block sum, exact
            for g, col in enumerate(transpose8(fn, rows)):
                at = fn.v(f"add i64 {fn.v(f'mul i64 {b}, {8 * ROWS}')}, {g * ROWS + 8 * half}")
                fn.store("<8 x i32>", col, fn.gep(sc.xi, at, "i32"), 32)
                x = fn.v(f"bitcast <8 x i32> {col} to <32 x i8>")
                sums = fn.v(f"call <8 x i32> @llvm.x86.avx512.vpdpbusd.256(<8 x i32> {sums}, "
                            f"<32 x i8> {splat('i8', 1)}, <32 x i8> {x})")
            if sc.xcorr is not None:
                at = fn.v(f"add i64 {fn.v(f'mul i64 {b}, {ROWS}')}, {8 * half}")
                fn.store("<8 x i32>", fn.v(f"mul <8 x i32> {sums}, {splat('i32', -layout.offset)}"),
                         fn.gep(sc.xcorr, at, "i32"), 32)
        _row_floats(fn, "%xd", k, first, b, sc.dx)
        if sc.sx is not None:
            _row_floats(fn, "%xe", k, first, b, sc.sx)
        return []

    fn.loop(0, k // BLOCK, [], body)


def _decode_quad(layout: Layout, fn: Function, k: int, cols: list[str], slot: str, sc: Scratch) -> None:
    """Every block of the quad's columns into the chunk's scratch, once per column chunk (a loop of
    its own, so that the tile loops read the scratch through broadcast memory operands)."""

    def body(b: str, _c: list[str]) -> list[str]:
        first_col = quad_at(fn, k, slot, b, BLOCK)
        blocks = [fn.gep(col, fn.v(f"mul i64 {b}, {layout.block_bytes}")) for col in cols]
        _decode_quad_block(layout, fn, blocks, fn.gep(sc.quants, fn.v(f"mul i64 {first_col}, {BLOCK}")),
                           fn.gep(sc.meta, fn.v(f"mul i64 {first_col}, {META}"), "i32"))
        return []

    fn.loop(0, k // BLOCK, [], body)


def _decode_quad_block(layout: Layout, fn: Function, blocks: list[str], quants: str, meta: str) -> None:
    """One block of the quad's 4 columns: column c's 32 weights as unsigned bytes w + offset (Q8_0's
    signed bytes flipped, the others' quants as stored) to quants + 32c; meta by field (8 i32): the 4
    columns' d, then their m (`_quad_scales`)."""
    for c, blk in enumerate(blocks):
        (chunk,) = layout.decode(fn, blk).chunks
        w = fn.v(f"xor <32 x i8> {chunk.w}, {splat('i8', -128)}") if chunk.signed else chunk.w
        fn.store("<32 x i8>", w, fn.gep(quants, c * BLOCK), 32)
    _quad_scales(layout, fn, blocks, meta)


def _quad_scales(layout: Layout, fn: Function, blocks: list[str], meta: str) -> None:
    """The 4 columns' d (and m: Q4_1, Q5_1), the f16 values each block opens with, widened together
    (one conversion a quad instead of one a column; widening is exact, the same floats the block
    decoders give) and stored by field."""
    words = 2 if layout.has_min else 1  # f16 values at the block's start
    elem = f"i{16 * words}"
    packed = "poison"
    for c, blk in enumerate(blocks):
        packed = fn.v(f"insertelement <{COLUMNS} x {elem}> {packed}, {elem} {fn.load(elem, blk, 2)}, i64 {c}")
    n = COLUMNS * words
    halves = fn.v(f"bitcast <{COLUMNS} x {elem}> {packed} to <{n} x half>")
    floats = fn.v(f"fpext <{n} x half> {halves} to <{n} x float>")
    if words == 2:  # d0 m0 d1 m1 .. -> d0 d1 d2 d3 m0 m1 m2 m3
        by_field = const_vec("i32", [0, 2, 4, 6, 1, 3, 5, 7])
        floats = fn.v(f"shufflevector <8 x float> {floats}, <8 x float> poison, {by_field}")
    fn.store(f"<{n} x float>", floats, meta, 16)


def _block(layout: Layout, fn: Function, k: int, sc: Scratch, slot: str, b: str, accs: list[str]) -> list[str]:
    """One block for the tile's 16 rows and the quad's columns; accs: acc per column (then accm per column)."""
    first_col = quad_at(fn, k, slot, b, BLOCK)
    quants = fn.gep(sc.quants, fn.v(f"mul i64 {first_col}, {BLOCK}"))
    meta = fn.gep(sc.meta, fn.v(f"mul i64 {first_col}, {META}"), "i32")
    xbase = fn.gep(sc.xi, fn.v(f"mul i64 {b}, {8 * ROWS}"), "i32")
    xs = [fn.v(f"bitcast <16 x i32> {fn.load('<16 x i32>', fn.gep(xbase, g * ROWS, 'i32'), 64)} to <64 x i8>")
          for g in range(8)]
    lanes = fn.v(f"mul i64 {b}, {ROWS}")
    dx = fn.load("<16 x float>", fn.gep(sc.dx, lanes, "float"), 64)
    start = "zeroinitializer"
    if sc.xcorr is not None:
        start = fn.load("<16 x i32>", fn.gep(sc.xcorr, lanes, "i32"), 64)
    new_acc, new_min = [], []
    for c in range(COLUMNS):
        # two independent integer chains, added (exact); the first starts from the rows' correction
        chains = [start, "zeroinitializer"]
        for g in range(8):
            w = fn.v(f"bitcast <16 x i32> {bcast(fn, fn.gep(quants, c * BLOCK + 4 * g))} to <64 x i8>")
            chains[g % 2] = dpbusd(fn, chains[g % 2], w, xs[g])
        isum = fn.v(f"sitofp <16 x i32> {fn.v(f'add <16 x i32> {chains[0]}, {chains[1]}')} to <16 x float>")
        dd = fn.v(f"fmul <16 x float> {bcast(fn, fn.gep(meta, c, 'i32'), 'float')}, {dx}")
        new_acc.append(fma16(fn, isum, dd, accs[c]))
    if sc.sx is not None:
        sx = fn.load("<16 x float>", fn.gep(sc.sx, lanes, "float"), 64)
        for c in range(COLUMNS):
            m = bcast(fn, fn.gep(meta, COLUMNS + c, "i32"), "float")
            new_min.append(fma16(fn, m, sx, accs[COLUMNS + c]))
    return new_acc + new_min


def _tiles(layout: Layout, fn: Function, k: int, sc: Scratch, start: str = "0") -> str:
    """All full tiles of 16 rows from row `start` on over [n0, n1); returns the first leftover row."""
    nb = k // BLOCK

    def results(slot: str) -> list[str]:
        carried = [("<16 x float>", "zeroinitializer")] * (COLUMNS * (2 if sc.sx is not None else 1))
        finals = fn.loop(0, nb, carried, lambda b, accs: _block(layout, fn, k, sc, slot, b, accs))
        if sc.sx is None:
            return finals
        return [fn.v(f"fadd <16 x float> {finals[c]}, {finals[COLUMNS + c]}") for c in range(COLUMNS)]

    return lane_tiles(fn, k, layout.block_bytes, _chunk(layout, k), lay_out=lambda first: _lay_out_tile(
        layout, fn, k, first, sc), decode_quad=partial(_decode_quad, layout, fn, k, sc=sc), quad_results=results,
                      start=start, block=BLOCK)


def _type_tiles(wtype) -> LaneTiles:
    layout = LAYOUTS[wtype]
    return LaneTiles(applies=partial(_applies, wtype), scratch=partial(_scratch, layout),
                     tiles=partial(_tiles, layout))


TILES = tuple(_type_tiles(wtype) for wtype in TYPES)
