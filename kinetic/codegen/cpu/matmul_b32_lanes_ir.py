"""Prompt tiles of Q8_0, Q4_1, Q5_0 and Q5_1 in the "block_chain" order on AVX-512 VNNI: 16 activation
rows as the 16 lanes of 512-bit vectors, four weight columns per register tile.

Owns: `TILES` (one `LaneTiles` per type: `applies`, the scratch, the tiles), the activations laid out
once per tile and column chunk (`_lay_out_tile`), a column's block decoded once per column chunk
(`_decode_column`) and a quad's block loop (`_block`). The tile, chunk and quad loops are
matmul_k_lanes_ir's (`lane_tiles`, `decode_quad`, with blocks of 32). The float order is
matmul_ir.py's "scalar" order extended to these types (orders.py's "block_chain"), one lane per row:

    isum = sum_i wq[i] * xq[i]                   exact int32 (Q5_0: q - 16, Q8_0: q, Q4_1 / Q5_1: q)
    acc  = fma(float(isum), d_w * d_x, acc)
    accm = fma(m_w, s_x, accm)                   (Q4_1, Q5_1; y = acc + accm at the end)

Each lane's float operations are the single-row code's (matmul_columns_ir.column_quads) on the same
operands, so every output is bit for bit the row alone, whatever M, the tile or the threads' columns.

The integer sums, without a reduction across lanes: each tile row's block b is laid out with its
bytes 4g..4g+3 in dword r of vector g (8 vectors a block), flipped to x + 128 (vpdpbusd's unsigned
operand). The quad's columns are decoded once per column chunk into a scratch (32 signed bytes a
block: Q8_0's q, Q5_0's q - 16, Q4_1's and Q5_1's q), so that `vpdpbusd(acc, x_g, broadcast(weight
dword g))` (the broadcast folded into the instruction: it is the signed operand) adds to lane r row
r's dot of those 4 weights plus 128 times their sum: 8 per block and column for 16 rows, starting
from -128 * (the column's block sum), decoded with it. Per block and column: 8 `vpdpbusd`, one
broadcast, one add, one convert, one multiply, one or two fmas for 512 products (matmul_wide_ir's
512-bit tiles spend 4 operations on 64).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from kinetic.codegen.cpu.llvm_ir import Function, splat
from kinetic.codegen.cpu.matmul_k_lanes_ir import (
    COLUMNS,
    MAX_K,
    ROWS,
    LaneTiles,
    bcast,
    chunk_columns,
    decode_quad,
    dpbusd,
    fma16,
    lane_tiles,
    quad_at,
    vector,
)
from kinetic.codegen.cpu.matmul_tiles_ir import transpose8
from kinetic.codegen.cpu.quant_blocks import LAYOUTS, Layout
from kinetic.codegen.cpu.target import FAST_CHAIN_KERNELS, dot8

BLOCK = 32
META = 3  # i32 per decoded column and block: d and m (f32 bits), -128 * the block's weight sum
TYPES = tuple(sorted(t for t in FAST_CHAIN_KERNELS if LAYOUTS[t].block == BLOCK))  # Q8_0, Q4_1, Q5_0, Q5_1


@dataclass(frozen=True)
class Scratch:
    """The tile's stack scratch, allocated in the kernel's entry block: xi [block][g 0..7][16 rows]
    i32 (the activation bytes + 128); dx, sx [block][16 rows] f32 (the rows' d and Q8_1 s); a chunk's
    columns decoded [slot][block][column]: quants 32 bytes and meta (d, m, correction) each."""

    xi: str
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
    return Scratch(fn.v(f"alloca i32, i64 {nb * 8 * ROWS}, align 64"),
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


def _lay_out_tile(fn: Function, k: int, first: str, sc: Scratch) -> None:
    """xi, dx and sx of the tile's 16 rows, block by block: two 8x8 dword transposes a block."""

    def body(b: str, _c: list[str]) -> list[str]:
        for half in range(2):
            rows = []
            for i in range(8):
                r = fn.v(f"add i64 {first}, {8 * half + i}")
                at = fn.v(f"add i64 {fn.v(f'mul i64 {r}, {k}')}, {fn.v(f'mul i64 {b}, {BLOCK}')}")
                x = fn.v(f"xor <32 x i8> {fn.load('<32 x i8>', fn.gep('%xq', at))}, {splat('i8', -128)}")
                rows.append(fn.v(f"bitcast <32 x i8> {x} to <8 x i32>"))
            for g, col in enumerate(transpose8(fn, rows)):
                at = fn.v(f"add i64 {fn.v(f'mul i64 {b}, {8 * ROWS}')}, {g * ROWS + 8 * half}")
                fn.store("<8 x i32>", col, fn.gep(sc.xi, at, "i32"), 32)
        _row_floats(fn, "%xd", k, first, b, sc.dx)
        if sc.sx is not None:
            _row_floats(fn, "%xe", k, first, b, sc.sx)
        return []

    fn.loop(0, k // BLOCK, [], body)


def _decode_column(layout: Layout, fn: Function, blk: str, quants: str, meta: str) -> None:
    """One column's block: its 32 weights as signed bytes (Q5_0's offset taken off) to `quants`; d, m
    and -128 * the weights' sum (what the activations' + 128 adds) to `meta`."""
    decoded = layout.decode(fn, blk)
    (chunk,) = decoded.chunks
    w = chunk.w if chunk.signed else fn.v(f"sub <32 x i8> {chunk.w}, {splat('i8', layout.offset)}")
    fn.store("<32 x i8>", w, quants, 32)
    fn.store("float", decoded.d, fn.gep(meta, 0, "float"), 4)
    if decoded.min_scale is not None:
        fn.store("float", decoded.min_scale, fn.gep(meta, 1, "float"), 4)
    sums = dot8(fn, "vnni", splat("i8", 1), w, False)  # sums of 4 weights (ones as the unsigned operand)
    total = fn.v(f"call i32 @llvm.vector.reduce.add.v8i32(<8 x i32> {sums})")
    fn.store("i32", fn.v(f"mul i32 {total}, -128"), fn.gep(meta, 2, "i32"), 4)


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
    new_acc, new_min = [], []
    for c in range(COLUMNS):
        # two independent integer chains, added (exact); the first starts from the column's correction
        chains = [bcast(fn, fn.gep(meta, c * META + 2, "i32")), "zeroinitializer"]
        for g in range(8):
            w = fn.v(f"bitcast <16 x i32> {bcast(fn, fn.gep(quants, c * BLOCK + 4 * g))} to <64 x i8>")
            chains[g % 2] = dpbusd(fn, chains[g % 2], xs[g], w)
        isum = fn.v(f"sitofp <16 x i32> {fn.v(f'add <16 x i32> {chains[0]}, {chains[1]}')} to <16 x float>")
        dd = fn.v(f"fmul <16 x float> {bcast(fn, fn.gep(meta, c * META, 'i32'), 'float')}, {dx}")
        new_acc.append(fma16(fn, isum, dd, accs[c]))
    if sc.sx is not None:
        sx = fn.load("<16 x float>", fn.gep(sc.sx, lanes, "float"), 64)
        for c in range(COLUMNS):
            m = bcast(fn, fn.gep(meta, c * META + 1, "i32"), "float")
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

    def decode(cols: list[str], slot: str) -> None:
        decode_quad(fn, k, cols, slot, block_bytes=layout.block_bytes, quants=sc.quants, meta=sc.meta,
                    meta_words=META, decode_column=partial(_decode_column, layout, fn), block=BLOCK)

    return lane_tiles(fn, k, layout.block_bytes, _chunk(layout, k), lay_out=lambda first: _lay_out_tile(
        fn, k, first, sc), decode_quad=decode, quad_results=results, start=start, block=BLOCK)


def _type_tiles(wtype) -> LaneTiles:
    layout = LAYOUTS[wtype]
    return LaneTiles(applies=partial(_applies, wtype), scratch=partial(_scratch, layout),
                     tiles=partial(_tiles, layout))


TILES = tuple(_type_tiles(wtype) for wtype in TYPES)
