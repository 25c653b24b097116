"""What the K-quant prompt tiles with rows in lanes share (matmul_q2k_lanes_ir .. matmul_q6k_lanes_ir):
16 activation rows as the 16 lanes of 512-bit vectors, four weight columns per register tile, on
AVX-512 VNNI.

Owns: the tile's shape (ROWS, COLUMNS), what a type's tiles give matmul_ir (`LaneTiles`, with the
rule `lane_applies`), the stack scratch (`Scratch`, `lane_scratch`), a type's tiles wired into the
loops (`type_lane_tiles`), the
activations laid out once per tile and column chunk (`lay_out_quads`: row r's super-block bytes
4g..4g+3 in dword r of vector g, flipped to x + 128 where vpdpbusd takes them unsigned; `lay_out_dx`:
the rows' d_x; the Q8_K sums as word pairs per sub-block pair or per 16, `lay_out_sub_block_pairs`,
`lay_out_sum16_pairs`), the loops (`lane_tiles`: column chunks; in each, every quad of columns
decoded once, `decode_quad`, into a scratch of at most DECODED_BYTES that all the chunk's tiles read,
then tiles of 16 rows, then quads, each quad's outputs stored row by row), the "lanes" order's
scaled integer dot of one lane (`scaled_lane_dot`) and float tree (`lane_sum_tree`), and small vector
helpers. Does not own any type's decoding or float order: the type's module gives the quad's decode
and its 16-row results, each lane one row's own float operations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kinetic.codegen.cpu.llvm_ir import Function, const_vec, splat
from kinetic.codegen.cpu.matmul_block_ir import CHUNK_BYTES, column_chunks
from kinetic.codegen.cpu.matmul_tiles_ir import transpose8
from kinetic.codegen.cpu.quant_blocks import Layout

ROWS = 16  # rows per tile: the lanes of a 512-bit vector of i32 / f32
COLUMNS = 4  # weight columns per register tile
SUPER = 256
MAX_K = 16384  # the stack scratch grows with K (16 bytes a value, + DECODED_BYTES): beyond, matmul_tiles_ir's tiles
DECODED_BYTES = 256 << 10  # a chunk's decoded columns (stack scratch, read by every tile from L2)

DECLARATIONS = [
    "declare <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>, <64 x i8>, <64 x i8>)",
    "declare <16 x i32> @llvm.x86.avx512.vpdpwssd.512(<16 x i32>, <32 x i16>, <32 x i16>)",
    "declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)",
    "declare <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8>, <32 x i8>)",
    "declare <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16>, <16 x i16>)",
]


@dataclass(frozen=True)
class LaneTiles:
    """One type's lane tiles as matmul_ir chooses them: whether they serve (layout, variant, tile, K),
    the scratch allocated in the kernel's entry block, and the tiles (fn, K, scratch, start row) ->
    the first row left to the other paths."""

    applies: Callable[[Layout, str, int, int], bool]
    scratch: Callable[[Function, int], object]
    tiles: Callable[[Function, int, object, str], str]


@dataclass(frozen=True)
class Scratch:
    """A lane tile's stack scratch, allocated in the kernel's entry block (before any loop): xi
    [super-block][g 0..63][16 rows] i32 (the activation bytes, as the type lays them out); pairs
    [super-block][p][16 rows] i32 (the type's activation sums as word pairs; None where it needs
    none); dx [super-block][16 rows] f32; a chunk's columns decoded, [slot][super-block][column]:
    quants 256 bytes each and `meta` i32 each. Each type's module says what its pairs, quants and
    meta hold."""

    xi: str
    pairs: str | None
    dx: str
    quants: str
    meta: str


def lane_scratch(fn: Function, k: int, block_bytes: int, meta: int, pairs: int) -> Scratch:
    """The scratch of a type whose blocks are `block_bytes`, with `meta` i32 per decoded column and
    super-block and `pairs` word pairs per super-block and row (0: none)."""
    nsb = k // SUPER
    slots = chunk_columns(k, block_bytes, SUPER + 4 * meta) // COLUMNS
    xi = fn.v(f"alloca i32, i64 {nsb * 64 * ROWS}, align 64")
    pair_words = fn.v(f"alloca i32, i64 {nsb * pairs * ROWS}, align 64") if pairs else None
    return Scratch(xi, pair_words,
                   fn.v(f"alloca float, i64 {nsb * ROWS}, align 64"),
                   fn.v(f"alloca i8, i64 {slots * nsb * COLUMNS * SUPER}, align 64"),
                   fn.v(f"alloca i32, i64 {slots * nsb * COLUMNS * meta}, align 64"))


def lane_applies(wtype) -> Callable[[Layout, str, int, int], bool]:
    """The rule for one type's lane tiles: that type in its ggml order on VNNI, for the default tile and
    above (smaller tiles keep matmul_tiles_ir's rows), K up to MAX_K (the stack scratch stays under 1 MB)."""

    def applies(layout: Layout, variant: str, tile: int, k: int) -> bool:
        return (layout.wtype is wtype and layout.dot_order is None and variant == "vnni" and tile >= 8
                and k <= MAX_K)

    return applies


def type_lane_tiles(fn: Function, k: int, sc: Scratch, start: str, *, block_bytes: int, meta_words: int,
                    lay_out_tile: Callable[[str], None], decode_column: Callable[[str, str, str], None],
                    quad_results: Callable[[str], list[str]]) -> str:
    """One type's full tiles of 16 rows from row `start` on (`lane_tiles` over its column chunks):
    `lay_out_tile(first)` lays out the tile's activations, `decode_column(blk, quants, meta)` decodes
    one column's super-block, `quad_results(slot)` gives a decoded quad's 16-row results; returns the
    first leftover row."""

    def decode(cols: list[str], slot: str) -> None:
        decode_quad(fn, k, cols, slot, block_bytes=block_bytes, quants=sc.quants, meta=sc.meta,
                    meta_words=meta_words, decode_column=decode_column)

    chunk = chunk_columns(k, block_bytes, SUPER + 4 * meta_words)
    return lane_tiles(fn, k, block_bytes, chunk, lay_out=lay_out_tile, decode_quad=decode,
                      quad_results=quad_results, start=start)


def lay_out_quads(fn: Function, k: int, first: str, s: str, xi: str, *, flip: bool = True) -> None:
    """xi[s][g][row] i32 <- bytes 4g..4g+3 (+ 128 each when `flip`: vpdpbusd's unsigned operand) of
    super-block s of the tile's rows: two 8x8 dword transposes per 8 dwords."""
    for half in range(2):
        for q in range(8):  # dwords 8q .. 8q+7 of rows 8*half .. 8*half+7
            vecs = []
            for i in range(8):
                r = fn.v(f"add i64 {first}, {8 * half + i}")
                within = fn.v(f"add i64 {fn.v(f'mul i64 {s}, {SUPER}')}, {32 * q}")
                at = fn.v(f"add i64 {fn.v(f'mul i64 {r}, {k}')}, {within}")
                x = fn.load("<32 x i8>", fn.gep("%xq", at))
                if flip:
                    x = fn.v(f"xor <32 x i8> {x}, {splat('i8', -128)}")
                vecs.append(fn.v(f"bitcast <32 x i8> {x} to <8 x i32>"))
            for i, col in enumerate(transpose8(fn, vecs)):
                g = 8 * q + i
                at = fn.v(f"add i64 {fn.v(f'mul i64 {s}, {64 * ROWS}')}, {g * ROWS + 8 * half}")
                fn.store("<8 x i32>", col, fn.gep(xi, at, "i32"), 32)


def lay_out_dx(fn: Function, k: int, first: str, s: str, dx: str) -> None:
    """dx[s][row] f32 <- the tile's rows' Q8_K scale of super-block s."""
    values = []
    for i in range(ROWS):
        r = fn.v(f"add i64 {first}, {i}")
        at = fn.v(f"add i64 {fn.v(f'mul i64 {r}, {k // SUPER}')}, {s}")
        values.append(fn.load("float", fn.gep("%xd", at, "float"), 4))
    fn.store("<16 x float>", vector(fn, "float", values), fn.gep(dx, fn.v(f"mul i64 {s}, {ROWS}"), "float"), 64)


def lay_out_sub_block_pairs(fn: Function, k: int, first: str, s: str, pairs: str) -> None:
    """pairs[s][t][row] i32 <- the row's sums of sub-blocks 2t, 2t+1 (32 values each, |sum| <= 32 *
    127 < 2^15) as a word pair, t = 0..3 (the minimum terms' operand)."""
    words_of_rows = [[] for _ in range(4)]
    for i in range(ROWS):
        sums = row_sums16(fn, k, fn.v(f"add i64 {first}, {i}"), s)
        even = fn.v(f"shufflevector <16 x i32> {sums}, <16 x i32> poison, {const_vec('i32', range(0, 16, 2))}")
        odd = fn.v(f"shufflevector <16 x i32> {sums}, <16 x i32> poison, {const_vec('i32', range(1, 16, 2))}")
        sub = fn.v(f"trunc <8 x i32> {fn.v(f'add <8 x i32> {even}, {odd}')} to <8 x i16>")  # 8 sub-block sums
        words = fn.v(f"bitcast <8 x i16> {sub} to <4 x i32>")  # dword t = (sum 2t, sum 2t+1)
        for t in range(4):
            words_of_rows[t].append(fn.v(f"extractelement <4 x i32> {words}, i64 {t}"))
    for t in range(4):
        at = fn.v(f"add i64 {fn.v(f'mul i64 {s}, {4 * ROWS}')}, {t * ROWS}")
        fn.store("<16 x i32>", vector(fn, "i32", words_of_rows[t]), fn.gep(pairs, at, "i32"), 64)


def lay_out_sum16_pairs(fn: Function, k: int, first: str, s: str, pairs: str) -> None:
    """pairs[s][l][row] i32 <- the row's Q8_K sums of 16 values 2l, 2l+1 as a word pair, l = 0..7
    (|sum| <= 16 * 127): two 8x8 dword transposes."""
    for half in range(2):
        words = []
        for i in range(8):
            sums = row_sums16(fn, k, fn.v(f"add i64 {first}, {8 * half + i}"), s)
            narrow = fn.v(f"trunc <16 x i32> {sums} to <16 x i16>")
            words.append(fn.v(f"bitcast <16 x i16> {narrow} to <8 x i32>"))
        for lane, col in enumerate(transpose8(fn, words)):
            at = fn.v(f"add i64 {fn.v(f'mul i64 {s}, {8 * ROWS}')}, {lane * ROWS + 8 * half}")
            fn.store("<8 x i32>", col, fn.gep(pairs, at, "i32"), 32)


def scaled_lane_dot(fn: Function, xs: list[str], quants: str, lane: int, scale_pairs: list[str], *,
                    signed: bool = False, start: str = "zeroinitializer") -> str:
    """<16 x i32>: per row, `start` + the sum over the chunks c = 0..7 of scale(c) * D(c), exact, D(c)
    the dot of the column's quants 32c + 4 lane .. + 3 (`quants` points to the column's super-block)
    with the row's activations there (xs[c]: the tile's vector of that dword, row r in lane r);
    scale_pairs[p] points to the word pair (scale(2p), scale(2p + 1)).

    Unsigned quants below 64 against signed activations: D = vpdpbusd(0, broadcast quants, x), |D| <=
    4 * 63 * 128 < 2^15. `signed` quants (|q| <= 4) against activations flipped to x + 128: E =
    vpdpbusd(0, x + 128, broadcast quants) = D + 128 * (the 4 quants' sum), |E| <= 4 * 255 * 4, the
    128's share taken back by the caller's `start`. Either fits a word, so two chunks' share a dword
    and one vpdpwssd applies both scales."""
    chains = [start, "zeroinitializer"]  # two independent integer chains, added (exact)
    for p in range(4):
        dots = []
        for c in (2 * p, 2 * p + 1):
            w = fn.v(f"bitcast <16 x i32> {bcast(fn, fn.gep(quants, 4 * (8 * c + lane)))} to <64 x i8>")
            dots.append(dpbusd(fn, "zeroinitializer", xs[c], w) if signed else dpbusd(fn, "zeroinitializer", w, xs[c]))
        low = fn.v(f"and <16 x i32> {dots[0]}, {splat('i32', 65535)}")
        high = fn.v(f"shl <16 x i32> {dots[1]}, {splat('i32', 16)}")
        packed = fn.v(f"bitcast <16 x i32> {fn.v(f'or <16 x i32> {low}, {high}')} to <32 x i16>")
        scale = fn.v(f"bitcast <16 x i32> {bcast(fn, scale_pairs[p])} to <32 x i16>")
        chains[p % 2] = dpwssd(fn, chains[p % 2], packed, scale)
    return fn.v(f"add <16 x i32> {chains[0]}, {chains[1]}")


def lane_sum_tree(fn: Function, finals: Callable[[int], list[str]]) -> list[str]:
    """Per column, the single-row order's sum of its 8 float lanes, ((a0 + a4) + (a2 + a6)) + ((a1 +
    a5) + (a3 + a7)), each vector lane one row's; finals(l) runs lane l's loop (in the order the tree
    needs them, so that at most three sums per column stay live)."""

    def add(a: list[str], b: list[str]) -> list[str]:
        return [fn.v(f"fadd <16 x float> {x}, {y}") for x, y in zip(a, b, strict=True)]

    even = add(add(finals(0), finals(4)), add(finals(2), finals(6)))
    odd = add(add(finals(1), finals(5)), add(finals(3), finals(7)))
    return add(even, odd)


def row_sums16(fn: Function, k: int, r: str, s: str) -> str:
    """<16 x i32>: row r's Q8_K sums of 16 activations of super-block s (|sum| < 2^15)."""
    at = fn.v(f"add i64 {fn.v(f'mul i64 {r}, {k // 16}')}, {fn.v(f'mul i64 {s}, 16')}")
    return fn.load("<16 x i32>", fn.gep("%xe", at, "i32"), 4)


def vector(fn: Function, elem: str, values: list[str]) -> str:
    v = "poison"
    for i, x in enumerate(values):
        v = fn.v(f"insertelement <{len(values)} x {elem}> {v}, {elem} {x}, i64 {i}")
    return v


def bcast(fn: Function, ptr: str, elem: str = "i32") -> str:
    """<16 x elem>: the value at ptr in every lane (a broadcast memory operand once LLVM folds it)."""
    return fn.splat_value(16, elem, fn.load(elem, ptr, 4))


def dpbusd(fn: Function, acc: str, x: str, w: str) -> str:
    """acc + per lane the dot of 4 unsigned bytes of x (<64 x i8>) with 4 signed bytes of w."""
    return fn.v(f"call <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32> {acc}, <64 x i8> {x}, <64 x i8> {w})")


def dpwssd(fn: Function, acc: str, a: str, b: str) -> str:
    """acc + per lane the dot of 2 signed words of a (<32 x i16>) with 2 signed words of b."""
    return fn.v(f"call <16 x i32> @llvm.x86.avx512.vpdpwssd.512(<16 x i32> {acc}, <32 x i16> {a}, <32 x i16> {b})")


def fma16(fn: Function, a: str, b: str, c: str) -> str:
    return fn.v(f"call <16 x float> @llvm.fma.v16f32(<16 x float> {a}, <16 x float> {b}, <16 x float> {c})")


def chunk_columns(k: int, block_bytes: int, decoded_bytes: int, block: int = SUPER) -> int:
    """Columns per chunk: about CHUNK_BYTES of weights, their decoded copy (`decoded_bytes` per column
    and block of `block` values) at most DECODED_BYTES, a multiple of COLUMNS."""
    nsb = k // block
    cols = min(CHUNK_BYTES // (nsb * block_bytes), DECODED_BYTES // (nsb * decoded_bytes))
    return max(COLUMNS, cols // COLUMNS * COLUMNS)


def quad_at(fn: Function, k: int, slot: str, s: str, block: int = SUPER) -> str:
    """i64: where a chunk's decoded scratch keeps (super-)block s of quad `slot`'s first column, in
    columns' entries ([slot][block][column]; blocks of `block` values)."""
    at = fn.v(f"add i64 {fn.v(f'mul i64 {slot}, {k // block}')}, {s}")
    return fn.v(f"mul i64 {at}, {COLUMNS}")


def decode_quad(fn: Function, k: int, cols: list[str], slot: str, *, block_bytes: int, quants: str, meta: str,
                meta_words: int, decode_column: Callable[[str, str, str], None], block: int = SUPER) -> None:
    """Every super-block of the quad's columns into a chunk's scratch ([slot][super-block][column]:
    256 quant bytes in `quants`, meta_words i32 in `meta` each), through decode_column(block,
    quants, meta): a loop of its own, so that the tile loops read the scratch through broadcast
    memory operands (in the block loop LLVM would forward the stores into registers)."""

    def body(s: str, _c: list[str]) -> list[str]:
        for c, col in enumerate(cols):
            at = fn.v(f"add i64 {quad_at(fn, k, slot, s, block)}, {c}")
            decode_column(fn.gep(col, fn.v(f"mul i64 {s}, {block_bytes}")),
                          fn.gep(quants, fn.v(f"mul i64 {at}, {block}")),
                          fn.gep(meta, fn.v(f"mul i64 {at}, {meta_words}"), "i32"))
        return []

    fn.loop(0, k // block, [], body)


def _quad_columns(fn: Function, q: str, c1: str) -> list[str]:
    """Columns q .. q+3; those past the chunk repeat its last (the same bits stored twice)."""
    last = fn.v(f"sub i64 {c1}, 1")
    cols = [q]
    for j in range(1, COLUMNS):
        n = fn.v(f"add i64 {q}, {j}")
        cols.append(fn.v(f"select i1 {fn.v(f'icmp slt i64 {n}, {c1}')}, i64 {n}, i64 {last}"))
    return cols


def lane_tiles(fn: Function, k: int, block_bytes: int, chunk: int, *, lay_out: Callable[[str], None],
               decode_quad: Callable[[list[str], str], None], quad_results: Callable[[str], list[str]],
               start: str = "0", block: int = SUPER) -> str:
    """All full tiles of 16 rows from row `start` on over [n0, n1); returns the first leftover row.
    Per chunk of `chunk` columns: decode_quad(the quad's weight rows, its slot q / 4 in the chunk) for
    every quad, once; then per tile lay_out(first row), and per quad quad_results(slot) gives one
    <16 x float> per column (lane i = row first + i)."""
    rb = k // block * block_bytes
    tiles = fn.v(f"udiv i64 {fn.v(f'sub i64 %m, {start}')}, {ROWS}")

    def slot(c0: str, q: str) -> str:
        return fn.v(f"udiv i64 {fn.v(f'sub i64 {q}, {c0}')}, {COLUMNS}")

    def chunk_body(c0: str, c1: str) -> None:
        def decode(q: str, _c: list[str]) -> list[str]:
            cols = _quad_columns(fn, q, c1)
            decode_quad([fn.gep("%w", fn.v(f"mul i64 {c}, {rb}")) for c in cols], slot(c0, q))
            return []

        any_tile = fn.v(f"icmp ugt i64 {tiles}, 0")  # decode, M = 1 .. 15: nothing to decode
        fn.loop(c0, fn.v(f"select i1 {any_tile}, i64 {c1}, i64 {c0}"), [], decode, step=COLUMNS)

        def tile(tt: str, _c: list[str]) -> list[str]:
            first = fn.v(f"add i64 {start}, {fn.v(f'mul i64 {tt}, {ROWS}')}")
            lay_out(first)

            def quad(q: str, _c2: list[str]) -> list[str]:
                cols = _quad_columns(fn, q, c1)
                for col, y in zip(cols, quad_results(slot(c0, q)), strict=True):
                    for i in range(ROWS):
                        r = fn.v(f"add i64 {first}, {i}")
                        at = fn.v(f"add i64 {fn.v(f'mul i64 {r}, %ldo')}, {col}")
                        fn.store("float", fn.v(f"extractelement <16 x float> {y}, i64 {i}"),
                                 fn.gep("%out", at, "float"), 4)
                return []

            fn.loop(c0, c1, [], quad, step=COLUMNS)
            return []

        fn.loop(0, tiles, [], tile)

    column_chunks(fn, chunk, chunk_body)
    return fn.v(f"add i64 {start}, {fn.v(f'mul i64 {tiles}, {ROWS}')}")
