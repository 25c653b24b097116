"""Q4_K prompt tiles on AVX-512 VNNI: 16 activation rows as the 16 lanes of 512-bit vectors, four
weight columns per register tile.

Owns: `applies`, the tile's scratch (`q4k_scratch`), the activations laid out once per tile and
column chunk (`_lay_out_tile`), the columns' decoded blocks (`_decode_column`) and the loops
(`q4k_tiles`: column chunks, then tiles of 16 rows, then quads of columns, then super-blocks). The
float order is matmul_ir.py's "scalar" order (ggml_gemv_q4_K_8x8_q8_K), one lane per row:

    acc  = fma(float(iacc), d_w * d_x, acc)        iacc = sum_j scale_j * (sub-block j's dot)
    accm = fma(float(imin), dmin * d_x, accm)      imin = sum_j min_j * (sub-block j's x sum)
    y    = acc - accm

iacc and imin are exact int32 (|iacc| < 8 * 63 * 32 * 15 * 127 < 2^31), so how they are summed is
free; each lane's float operations are the single-row code's on the same operands, so every output
is bit for bit the row alone (and the reference), whatever M, the tile or the threads' columns.

The integer sums, without a reduction across lanes: row r's super-block is laid out once per tile
with its bytes 4g..4g+3 in dword r of vector g (64 vectors, `_lay_out_tile`), flipped to unsigned
(x + 128). The quad's columns are decoded (quants 0..15) into a scratch once per tile, in a loop of
their own (in the block loop LLVM would forward the stores into registers and broadcast from there),
and `vpdpbusd(acc, x_g, broadcast(weight dword g))` adds to lane r row r's dot of those 4 weights:
8 per sub-block, 64 per super-block for 16 rows, the broadcast folded into the instruction
(`{1to16}`). The + 128 costs
128 * sum_j scale_j * (sum of sub-block j's quants), one integer per column and super-block, taken
back once. imin uses `vpdpwssd` on (x sum of sub-block 2t, 2t+1) as 16-bit pairs per lane (|sum| <=
32 * 127) against the column's (min_2t, min_2t+1) broadcast: 4 per super-block.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.blocks_classic import _k4_scales
from kinetic.codegen.cpu.llvm_ir import Function, const_vec, splat
from kinetic.codegen.cpu.matmul_block_ir import CHUNK_BYTES, column_chunks
from kinetic.codegen.cpu.matmul_tiles_ir import transpose8
from kinetic.codegen.cpu.quant_blocks import Layout

ROWS = 16  # rows per tile: the lanes of a 512-bit vector of i32 / f32
COLUMNS = 4  # weight columns per register tile
SUPER = 256
BLOCK_BYTES = 144

DECLARATIONS = [
    "declare <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>, <64 x i8>, <64 x i8>)",
    "declare <16 x i32> @llvm.x86.avx512.vpdpwssd.512(<16 x i32>, <32 x i16>, <32 x i16>)",
    "declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)",
    "declare <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8>, <32 x i8>)",
    "declare <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16>, <16 x i16>)",
]


MAX_K = 16384  # the scratch grows with K (about 20 bytes a value): beyond this, matmul_tiles_ir's tiles


def applies(layout: Layout, variant: str, tile: int, k: int) -> bool:
    """Q4_K on VNNI, for the default tile and above (smaller tiles keep matmul_tiles_ir's rows), K up
    to MAX_K (the stack scratch stays under 1 MB)."""
    return layout.wtype is Q.Q4_K and variant == "vnni" and tile >= 8 and k <= MAX_K


@dataclass(frozen=True)
class Scratch:
    """xi [super-block][g 0..63][16 rows] i32 (x + 128 bytes); pairs [super-block][t 0..3][16 rows]
    i32 (16-bit x sums of sub-blocks 2t, 2t+1); dx [super-block][16 rows] f32; the quad's columns
    decoded, [super-block][column]: quants 256 bytes each, and META i32 each (`meta`)."""

    xi: str
    pairs: str
    dx: str
    quants: str
    meta: str


def q4k_scratch(fn: Function, k: int) -> Scratch:
    """Allocate the scratch in the entry block (before any loop)."""
    nsb = k // SUPER
    return Scratch(fn.v(f"alloca i32, i64 {nsb * 64 * ROWS}, align 64"),
                   fn.v(f"alloca i32, i64 {nsb * 4 * ROWS}, align 64"),
                   fn.v(f"alloca float, i64 {nsb * ROWS}, align 64"),
                   fn.v(f"alloca i8, i64 {nsb * COLUMNS * SUPER}, align 64"),
                   fn.v(f"alloca i32, i64 {nsb * COLUMNS * META}, align 64"))


def _lay_out_tile(fn: Function, k: int, first: str, sc: Scratch) -> None:
    """The tile's activations: xi (two 8x8 dword transposes per 8 dwords), pairs and dx."""
    nsb = k // SUPER

    def body(s: str, _c: list[str]) -> list[str]:
        for half in range(2):
            for q in range(8):  # dwords 8q .. 8q+7 of rows 8*half .. 8*half+7
                vecs = []
                for i in range(8):
                    r = fn.v(f"add i64 {first}, {8 * half + i}")
                    within = fn.v(f"add i64 {fn.v(f'mul i64 {s}, {SUPER}')}, {32 * q}")
                    at = fn.v(f"add i64 {fn.v(f'mul i64 {r}, {k}')}, {within}")
                    x = fn.load("<32 x i8>", fn.gep("%xq", at))
                    flipped = fn.v(f"xor <32 x i8> {x}, {splat('i8', -128)}")
                    vecs.append(fn.v(f"bitcast <32 x i8> {flipped} to <8 x i32>"))
                for i, col in enumerate(transpose8(fn, vecs)):
                    g = 8 * q + i
                    at = fn.v(f"add i64 {fn.v(f'mul i64 {s}, {64 * ROWS}')}, {g * ROWS + 8 * half}")
                    fn.store("<8 x i32>", col, fn.gep(sc.xi, at, "i32"), 32)
        pairs = [[] for _ in range(4)]
        dxs = []
        for i in range(ROWS):
            r = fn.v(f"add i64 {first}, {i}")
            sums = fn.load("<16 x i32>", fn.gep("%xe", fn.v(f"add i64 {fn.v(f'mul i64 {r}, {k // 16}')}, "
                                                            f"{fn.v(f'mul i64 {s}, 16')}"), "i32"), 4)
            even = fn.v(f"shufflevector <16 x i32> {sums}, <16 x i32> poison, {const_vec('i32', range(0, 16, 2))}")
            odd = fn.v(f"shufflevector <16 x i32> {sums}, <16 x i32> poison, {const_vec('i32', range(1, 16, 2))}")
            sub = fn.v(f"trunc <8 x i32> {fn.v(f'add <8 x i32> {even}, {odd}')} to <8 x i16>")  # 8 sub-block sums
            words = fn.v(f"bitcast <8 x i16> {sub} to <4 x i32>")  # dword t = (sum 2t, sum 2t+1)
            for t in range(4):
                pairs[t].append(fn.v(f"extractelement <4 x i32> {words}, i64 {t}"))
            dxs.append(fn.load("float", fn.gep("%xd", fn.v(f"add i64 {fn.v(f'mul i64 {r}, {k // SUPER}')}, {s}"),
                                               "float"), 4))
        for t in range(4):
            fn.store("<16 x i32>", _vector(fn, "i32", pairs[t]),
                     fn.gep(sc.pairs, fn.v(f"add i64 {fn.v(f'mul i64 {s}, {4 * ROWS}')}, {t * ROWS}"), "i32"), 64)
        fn.store("<16 x float>", _vector(fn, "float", dxs), fn.gep(sc.dx, fn.v(f"mul i64 {s}, {ROWS}"), "float"), 64)
        return []

    fn.loop(0, nsb, [], body)


def _vector(fn: Function, elem: str, values: list[str]) -> str:
    v = "poison"
    for i, x in enumerate(values):
        v = fn.v(f"insertelement <{len(values)} x {elem}> {v}, {elem} {x}, i64 {i}")
    return v


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


def _decode_quad(fn: Function, k: int, sc: Scratch, cols: list[str]) -> None:
    """Every super-block of the quad's columns into the scratch, once per tile and quad (a loop of its
    own: the block loop then reads the scratch through broadcast memory operands)."""
    nsb = k // SUPER

    def body(s: str, _c: list[str]) -> list[str]:
        for c, col in enumerate(cols):
            at = fn.v(f"add i64 {fn.v(f'mul i64 {s}, {COLUMNS}')}, {c}")
            _decode_column(fn, fn.gep(col, fn.v(f"mul i64 {s}, {BLOCK_BYTES}")),
                           fn.gep(sc.quants, fn.v(f"mul i64 {at}, {SUPER}")),
                           fn.gep(sc.meta, fn.v(f"mul i64 {at}, {META}"), "i32"))
        return []

    fn.loop(0, nsb, [], body)


def _bcast(fn: Function, ptr: str, elem: str = "i32") -> str:
    return fn.splat_value(16, elem, fn.load(elem, ptr, 4))


def _super_block(fn: Function, sc: Scratch, s: str, accs: list[str]) -> list[str]:
    """One super-block for the tile's 16 rows and the quad's columns; accs: acc per column, accm per column."""
    first_col = fn.v(f"mul i64 {s}, {COLUMNS}")
    quants = fn.gep(sc.quants, fn.v(f"mul i64 {first_col}, {SUPER}"))
    meta = fn.gep(sc.meta, fn.v(f"mul i64 {first_col}, {META}"), "i32")
    xbase = fn.gep(sc.xi, fn.v(f"mul i64 {s}, {64 * ROWS}"), "i32")
    totals = [_bcast(fn, fn.gep(meta, c * META + 12, "i32")) for c in range(COLUMNS)]
    for j in range(8):
        chains = [["zeroinitializer"] * 2 for _ in range(COLUMNS)]
        for g in range(8):
            x = fn.v(f"bitcast <16 x i32> {fn.load('<16 x i32>', fn.gep(xbase, (8 * j + g) * ROWS, 'i32'), 64)} "
                     f"to <64 x i8>")
            for c in range(COLUMNS):
                w = fn.v(f"bitcast <16 x i32> {_bcast(fn, fn.gep(quants, c * SUPER + 32 * j + 4 * g))} to <64 x i8>")
                chains[c][g % 2] = fn.v(f"call <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32> {chains[c][g % 2]}, "
                                        f"<64 x i8> {x}, <64 x i8> {w})")
        for c in range(COLUMNS):
            dot = fn.v(f"add <16 x i32> {chains[c][0]}, {chains[c][1]}")
            scale = _bcast(fn, fn.gep(meta, c * META + j, "i32"))
            totals[c] = fn.v(f"add <16 x i32> {totals[c]}, {fn.v(f'mul <16 x i32> {dot}, {scale}')}")
    pbase = fn.gep(sc.pairs, fn.v(f"mul i64 {s}, {4 * ROWS}"), "i32")
    xsums = [fn.v(f"bitcast <16 x i32> {fn.load('<16 x i32>', fn.gep(pbase, t * ROWS, 'i32'), 64)} to <32 x i16>")
             for t in range(4)]
    dx = fn.load("<16 x float>", fn.gep(sc.dx, fn.v(f"mul i64 {s}, {ROWS}"), "float"), 64)
    new_acc, new_min = [], []
    for c in range(COLUMNS):
        imin = "zeroinitializer"
        for t in range(4):
            mins = fn.v(f"bitcast <16 x i32> {_bcast(fn, fn.gep(meta, c * META + 8 + t, 'i32'))} to <32 x i16>")
            imin = fn.v(f"call <16 x i32> @llvm.x86.avx512.vpdpwssd.512(<16 x i32> {imin}, <32 x i16> {xsums[t]}, "
                        f"<32 x i16> {mins})")
        for value, at, acc, out in ((totals[c], 13, accs[c], new_acc), (imin, 14, accs[COLUMNS + c], new_min)):
            f = fn.v(f"sitofp <16 x i32> {value} to <16 x float>")
            scale = _bcast(fn, fn.gep(meta, c * META + at, "i32"), "float")
            sdx = fn.v(f"fmul <16 x float> {scale}, {dx}")
            out.append(fn.v(f"call <16 x float> @llvm.fma.v16f32(<16 x float> {f}, <16 x float> {sdx}, "
                            f"<16 x float> {acc})"))
    return new_acc + new_min


def q4k_tiles(fn: Function, layout: Layout, k: int, sc: Scratch, start: str = "0") -> str:
    """All full tiles of 16 rows from row `start` on over [n0, n1); returns the first leftover row."""
    nsb = k // SUPER
    rb = nsb * BLOCK_BYTES
    tiles = fn.v(f"udiv i64 {fn.v(f'sub i64 %m, {start}')}, {ROWS}")

    def chunk_body(c0: str, c1: str) -> None:
        def tile(tt: str, _c: list[str]) -> list[str]:
            first = fn.v(f"add i64 {start}, {fn.v(f'mul i64 {tt}, {ROWS}')}")
            _lay_out_tile(fn, k, first, sc)

            def quad(q: str, _c2: list[str]) -> list[str]:
                last = fn.v(f"sub i64 {c1}, 1")
                cols = [q]
                for j in range(1, COLUMNS):  # columns past the chunk repeat its last (same bits stored)
                    n = fn.v(f"add i64 {q}, {j}")
                    cols.append(fn.v(f"select i1 {fn.v(f'icmp slt i64 {n}, {c1}')}, i64 {n}, i64 {last}"))
                _decode_quad(fn, k, sc, [fn.gep("%w", fn.v(f"mul i64 {c}, {rb}")) for c in cols])
                carried = [("<16 x float>", "zeroinitializer")] * (2 * COLUMNS)
                finals = fn.loop(0, nsb, carried, lambda s, accs: _super_block(fn, sc, s, accs))
                for c, col in enumerate(cols):
                    y = fn.v(f"fsub <16 x float> {finals[c]}, {finals[COLUMNS + c]}")
                    for i in range(ROWS):
                        r = fn.v(f"add i64 {first}, {i}")
                        at = fn.v(f"add i64 {fn.v(f'mul i64 {r}, %ldo')}, {col}")
                        fn.store("float", fn.v(f"extractelement <16 x float> {y}, i64 {i}"),
                                 fn.gep("%out", at, "float"), 4)
                return []

            fn.loop(c0, c1, [], quad, step=COLUMNS)
            return []

        fn.loop(0, tiles, [], tile)

    column_chunks(fn, max(COLUMNS, CHUNK_BYTES // rb // COLUMNS * COLUMNS), chunk_body)
    return fn.v(f"add i64 {start}, {fn.v(f'mul i64 {tiles}, {ROWS}')}")
