"""Rows alone of block-32 types in the "scalar" order (decode, and rows left below a tile): eight
weight rows at a time, so that their fma chains share vectors (the "lanes" order's two rows at a
time are matmul_pairs_ir's `column_pairs`).

Owns: `column_quads` (eight columns as one <8 x float> chain, the "scalar" order of IQ4_NL, MXFP4
and Q4_0, and of Q8_0, Q4_1, Q5_0 and Q5_1 in "block_chain", with Q4_1's and Q5_1's
accm = fma(m_w, s_x, accm); several rows in groups that decode each block once: QUAD_GROUPS), their pair decoders where they differ from the layout's (QUAD_PAIRS,
QUAD_PAIRS_VBMI) and software prefetch (in the block_chain order bounded by the call's columns and
led in: CHAIN_PREFETCH_BYTES). The order is matmul_ir.py's, eight rows per vector op.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.blocks_classic import (
    MULTISHIFT_DECLARATION,
    heads_d,
    pair_q5_0_heads,
    pair_q5_0_multishift,
    pair_q5_vector,
)
from kinetic.codegen.cpu.llvm_ir import Function, const_vec, splat
from kinetic.codegen.cpu.matmul_block_ir import column_chunks, fma8, lookup_codes, row_offset
from kinetic.codegen.cpu.matmul_pairs_ir import column_step
from kinetic.codegen.cpu.quant_blocks import Layout
from kinetic.codegen.cpu.target import dot8, dot8_acc, host

# ---- leftover rows of block-32 "scalar" types (IQ4_NL, MXFP4, Q4_0; Q8_0 .. Q5_1 in block_chain) ------
#
# ggml's repacked gemv keeps one float per output column: per block, acc = fma(float(the block's
# integer total), d_w * d_x, acc). A column alone would wait on that fma's latency every 32 values;
# four (or eight) columns run as one <4 x float> (<8 x float>) chain. Columns (n, n+1), (n+2, n+3), ..
# are PairBlocks; each gives, after its two dot8s (the second accumulating onto the first), [n's 4
# lanes | n+1's 4 lanes], and shuffle-add levels reduce them to the totals in the lane order
# [n, n+2, n+1, n+3 (, n+4, n+6, n+5, n+7)], against the scales in the same order times d_x. For
# offset types (MXFP4; IQ4_NL on VNNI) the first dot starts from -offset * (the block's activation
# quad sums, lanes l and l+4 folded), so each column's total includes its offset term exactly once
# (Q8_0 on VNNI: its bytes read as q + 128, offset 128). Q4_1's and Q5_1's minimum is a second
# chain, accm = fma(m_w, s_x, accm), added to acc at the end. Columns past the end repeat the last one
# (same bits stored). Eight columns share one scale conversion, one fma and the loop's work among twice
# the columns of four (decode from memory 1.2-1.3x faster for Q4_1, Q8_0, Q4_0 and IQ4_NL: measured by
# benchmarks/matmul_decode_ab.py); each column's float operations are the same at either width.

QUAD_PREFETCH_BYTES = 16384  # how far ahead of the columns in flight their software prefetch reads
# The block_chain order's quads (an order other than the type's ggml order: the fast numerics mode;
# the ggml order's quads keep their IR) differ in three ways, none in their float operations:
# * their prefetch runs CHAIN_PREFETCH_BYTES ahead, stays inside the call's columns, and the call
#   first prefetches that whole window (`_lead_in`). A decode step calls a kernel once per thread
#   and weight, on that thread's share of the columns (SmolLM2's attn_k: 96 rows of 360 bytes),
#   so a share's first 16 KB came in on demand misses and its prefetch ran 16 KB past its end into
#   memory the thread never read. Measured on model-shaped tensors visited out of memory order, one
#   thread's half shares (CPU time, `benchmarks/matmul_decode_ab.py --shares`; docs/cpu-kernels.md):
#   Gemma's attn_k (Q5_0, N 256) went from 0.67x the ggml order's speed to 1.11x, its attn_v (Q8_0)
#   from 0.78x to 1.10x, SmolLM2's attn_k (Q4_1, N 192) from 1.04x to 1.29x;
# * whole quads address their eight rows from one base (`_quad_rows`), the last partial quad as before;
# * on AVX-512 (the vnni variant), Q5_0's and Q5_1's fifth bits are spread in vector registers and
#   Q5_0's d and qh read as one 8-byte load a row (QUAD_PAIRS; Gemma's q/k/gate/up 1.2x the ggml order);
#   with VBMI, Q5_0's fifth bits by `vpmultishiftqb` and its eight d from the heads in one conversion
#   (QUAD_PAIRS_VBMI: in-cache decode 1.17x on Zen 4, the same bytes and scales).
CHAIN_PREFETCH_BYTES = 8192
QUAD_COLUMNS = 8  # columns a block step runs (4 or 8; the same bits: each column's operations are its own)
# the block_chain quads' pair decoders where they differ from the layout's (the same bytes, fewer operations)
QUAD_PAIRS = {Q.Q5_0: pair_q5_0_heads, Q.Q5_1: pair_q5_vector(4)}
QUAD_PAIRS_VBMI = {Q.Q5_0: pair_q5_0_multishift}  # where the host has AVX-512 VBMI (vpmultishiftqb)
# rows that share each decoded block, largest first (a Convoy pass's few decode rows, rows left below a
# tile); the rows left after the groups go alone. Each row keeps its own chains: the same bits.
QUAD_GROUPS = (4, 3, 2)
QUAD_REDUCE = ([0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15])


@dataclass(frozen=True)
class QuadRow:
    """One activation row's pointers in a quad sweep: its bytes, d_x (and s_x), output row, offsets."""

    x: str
    dx: str
    sx: str | None
    out: str
    corr: str | None


def _lane_columns(width: int) -> list[int]:
    """The column (from the first) each lane of the chain holds: [0, 2, 1, 3] per group of four."""
    return [g + c for g in range(0, width, 4) for c in (0, 2, 1, 3)]


def _fill_folded(fn: Function, layout: Layout, variant: str, k: int, r: str, dst: str) -> None:
    """dst[b] <- <4 x i32>: lane l = -offset * (x_4l + .. + x_4l+3 + x_4l+16 + .. + x_4l+19) of block b."""
    off = row_offset(layout, variant)
    xq = fn.gep("%xq", fn.v(f"mul i64 {r}, {k}"))
    ones = splat("i8", off if off < 128 else off - 256)

    def body(b: str, _c: list[str]) -> list[str]:
        total = dot8(fn, variant, ones, fn.load("<32 x i8>", fn.gep(xq, fn.v(f"mul i64 {b}, 32"))), False)
        lo = fn.v(f"shufflevector <8 x i32> {total}, <8 x i32> poison, {const_vec('i32', range(4))}")
        hi = fn.v(f"shufflevector <8 x i32> {total}, <8 x i32> poison, {const_vec('i32', range(4, 8))}")
        neg = fn.v(f"sub <4 x i32> zeroinitializer, {fn.v(f'add <4 x i32> {lo}, {hi}')}")
        fn.store("<4 x i32>", neg, fn.gep(dst, fn.v(f"mul i64 {b}, 4"), "i32"), 16)
        return []

    fn.loop(0, k // 32, [], body)


def _pair_dot(fn: Function, variant: str, pb, xl: str, xh: str, start: str | None, offset: int) -> str:
    """<8 x i32> [a's 4 lanes | c's 4 lanes] of a PairBlock (lanes l and l+4 of each row summed)."""
    lo, hi, signed = pb.low, pb.high, pb.signed
    if pb.table is not None:
        lo, signed = lookup_codes(fn, variant, pb.table, lo, offset)
        hi, _ = lookup_codes(fn, variant, pb.table, hi, offset)
    elif signed and start is not None:  # Q8_0 on VNNI: its bytes read unsigned (+ 128), taken back by start
        lo, hi = (fn.v(f"xor <32 x i8> {v}, {splat('i8', -128)}") for v in (lo, hi))
    if start is not None:
        return dot8_acc(fn, variant, dot8_acc(fn, variant, start, lo, xl, False), hi, xh, False)
    return dot8_acc(fn, variant, dot8(fn, variant, lo, xl, signed), hi, xh, signed)


def fma4(fn: Function, a: str, b: str, c: str) -> str:
    return fn.v(f"call <4 x float> @llvm.fma.v4f32(<4 x float> {a}, <4 x float> {b}, <4 x float> {c})")


def _shuffle(fn: Function, ty: str, a: str, b: str, idx) -> str:
    return fn.v(f"shufflevector {ty} {a}, {ty} {b}, {const_vec('i32', idx)}")


def _concat(fn: Function, elem: str, parts: list[str], size: int) -> str:
    """<len(parts) * size x elem>: the parts one after another (a balanced tree of shuffles)."""
    while len(parts) > 1:
        ty = f"<{size} x {elem}>"
        parts = [_shuffle(fn, ty, parts[i], parts[i + 1], range(2 * size)) for i in range(0, len(parts), 2)]
        size *= 2
    return parts[0]


def _totals(fn: Function, dots: list[str]) -> str:
    """<width x float> of the integer totals in _lane_columns order, from the pairs' <8 x i32> dots."""
    halves = []  # per pair of pairs: [n, n+2, n+1, n+3] with two lanes each
    for v1, v2 in zip(dots[0::2], dots[1::2], strict=True):
        s8 = [_shuffle(fn, "<8 x i32>", v1, v2, m) for m in QUAD_REDUCE]
        halves.append(fn.v(f"add <8 x i32> {s8[0]}, {s8[1]}"))
    if len(halves) == 1:  # four columns
        t4 = [_shuffle(fn, "<8 x i32>", halves[0], "poison", m) for m in ([0, 2, 4, 6], [1, 3, 5, 7])]
        return fn.v(f"sitofp <4 x i32> {fn.v(f'add <4 x i32> {t4[0]}, {t4[1]}')} to <4 x float>")
    t8 = [_shuffle(fn, "<8 x i32>", halves[0], halves[1], range(j, 16, 2)) for j in (0, 1)]
    return fn.v(f"sitofp <8 x i32> {fn.v(f'add <8 x i32> {t8[0]}, {t8[1]}')} to <8 x float>")


def _quad_scales(fn: Function, layout: Layout, pbs: list, w: list[str]) -> tuple[str, str | None]:
    """(d, m) of the columns as <width x float> in _lane_columns order: d from the pair decoders where
    they read it (the table types), else each block's f16 d at byte 0 (and Q4_1's, Q5_1's m at byte 2;
    None for the types without a minimum)."""
    width = len(w)
    lanes = _lane_columns(width)
    if pbs[0].heads is not None:
        return heads_d(fn, [pb.heads for pb in pbs], lanes), None
    if pbs[0].d is not None:
        d = _concat(fn, "float", [pb.d for pb in pbs], 2)
        return _shuffle(fn, f"<{width} x float>", d, "poison", lanes), None
    if not layout.has_min:
        d = "poison"
        for lane, col in enumerate(lanes):
            d = fn.v(f"insertelement <{width} x half> {d}, half {fn.load('half', w[col])}, i64 {lane}")
        return fn.v(f"fpext <{width} x half> {d} to <{width} x float>"), None
    pairs = _concat(fn, "half", [fn.load("<2 x half>", w[col]) for col in lanes], 2)  # [d, m] a lane
    both = fn.v(f"fpext <{2 * width} x half> {pairs} to <{2 * width} x float>")
    ty = f"<{2 * width} x float>"
    d, m = (_shuffle(fn, ty, both, "poison", range(j, 2 * width, 2)) for j in (0, 1))
    return d, m


def _prefetch_lines(layout: Layout, width: int) -> int:
    """Cache lines prefetched a block step: as many as the columns' blocks span (Q8_0's 8 x 34 bytes: 5)."""
    return -(-width * layout.block_bytes // 64)


def _at_most(fn: Function, value: str, limit: str) -> str:
    return fn.v(f"select i1 {fn.v(f'icmp slt i64 {value}, {limit}')}, i64 {value}, i64 {limit}")


def _lead_in(fn: Function, c0: str, c1: str, rb: int, ahead: int) -> None:
    """Prefetches of the first `ahead` bytes of columns [c0, c1) (all of them when fewer), one a
    cache line, before the first quad: the quads' own prefetches run `ahead` bytes in front of them."""
    start = fn.v(f"mul i64 {c0}, {rb}")
    span = fn.v(f"mul i64 {fn.v(f'sub i64 {c1}, {c0}')}, {rb}")
    end = _at_most(fn, span, str(ahead))
    base = fn.gep("%w", start)
    fn.loop(0, end, [], lambda at, _c: fn.prefetch(base, at) or [], step=64)


def _quad_rows(fn: Function, p: str, c1: str, width: int, rb: int, whole: bool) -> tuple[list[str], list[str]]:
    """The columns of the quad from p (i64 values) and their weight rows (pointers): p + j, or with
    those at or past c1 replaced by c1 - 1; whole quads' rows as offsets from the first."""
    if whole:
        cols = [p] + [fn.v(f"add i64 {p}, {j}") for j in range(1, width)]
        first = fn.gep("%w", fn.v(f"mul i64 {p}, {rb}"))
        return cols, [first] + [fn.gep(first, j * rb) for j in range(1, width)]
    last = fn.v(f"sub i64 {c1}, 1")
    cols = [p]
    for j in range(1, width):
        q = fn.v(f"add i64 {p}, {j}")
        cols.append(fn.v(f"select i1 {fn.v(f'icmp slt i64 {q}, {c1}')}, i64 {q}, i64 {last}"))
    return cols, [fn.gep("%w", fn.v(f"mul i64 {c}, {rb}")) for c in cols]


def _fma(fn: Function, width: int, a: str, b: str, c: str) -> str:
    return fma4(fn, a, b, c) if width == 4 else fma8(fn, a, b, c)


def _quad_pair_decoder(layout: Layout, variant: str):
    """The quads' pair decoder: the layout's, or in block_chain on VNNI QUAD_PAIRS(_VBMI)'s."""
    if layout.dot_order is None or variant != "vnni":
        return layout.decode_pair
    if "avx512vbmi" in host().flags and layout.wtype in QUAD_PAIRS_VBMI:
        return QUAD_PAIRS_VBMI[layout.wtype]
    return QUAD_PAIRS.get(layout.wtype, layout.decode_pair)


def quad_declarations(layout: Layout, variant: str) -> list[str]:
    """The intrinsics the quads' pair decoder calls beyond the variant's."""
    return [MULTISHIFT_DECLARATION] if _quad_pair_decoder(layout, variant) is pair_q5_0_multishift else []


def column_quads(fn: Function, layout: Layout, variant: str, k: int, first_row: str, corr: str | None) -> None:
    """Columns [n0, n1) for rows [first_row, m), QUAD_COLUMNS columns at a time (chunks as in
    matmul_pairs_ir.column_pairs), rows in groups of QUAD_GROUPS sharing each decoded block. `corr`:
    max(QUAD_GROUPS) * k / 8 i32 where the type has an offset (row_offset), else None."""
    width = QUAD_COLUMNS
    nb, bb, rb, offset, step = column_step(fn, layout, variant, k, first_row, width)
    chain = layout.dot_order is not None  # an order other than the type's ggml order (see CHAIN_PREFETCH_BYTES)
    decode_pair = _quad_pair_decoder(layout, variant)
    dup16 = const_vec("i32", list(range(16)) * 2)
    dup4 = const_vec("i32", [0, 1, 2, 3] * 2)
    ahead = -(-(CHAIN_PREFETCH_BYTES if chain else QUAD_PREFETCH_BYTES) // (width * rb)) * width * rb
    vf = f"<{width} x float>"
    per = 2 if layout.has_min else 1  # float chains a row: acc (and accm)

    def row_dot(row: QuadRow, b: str, pbs: list, d: str, m: str | None, accs: list[str]) -> list[str]:
        """One row's block step on the decoded pairs: acc = fma(totals, d_w * d_x, acc) (and accm)."""
        xb = fn.gep(row.x, fn.v(f"mul i64 {b}, 32"))
        xl = fn.v(f"shufflevector <16 x i8> {fn.load('<16 x i8>', xb)}, <16 x i8> poison, {dup16}")
        xh = fn.v(f"shufflevector <16 x i8> {fn.load('<16 x i8>', fn.gep(xb, 16))}, <16 x i8> poison, {dup16}")
        start = None
        if offset:
            folded = fn.load("<4 x i32>", fn.gep(row.corr, fn.v(f"mul i64 {b}, 4"), "i32"), 16)
            start = fn.v(f"shufflevector <4 x i32> {folded}, <4 x i32> poison, {dup4}")
        totals = _totals(fn, [_pair_dot(fn, variant, pb, xl, xh, start, offset) for pb in pbs])
        dx = fn.load("float", fn.gep(row.dx, b, "float"), 4)
        scale = fn.v(f"fmul {vf} {d}, {fn.splat_value(width, 'float', dx)}")
        new = [_fma(fn, width, totals, scale, accs[0])]
        if m is not None:  # accm = fma(m_w, s_x, accm)
            sx = fn.load("float", fn.gep(row.sx, b, "float"), 4)
            new.append(_fma(fn, width, m, fn.splat_value(width, "float", sx), accs[1]))
        return new

    def quad(group: list[QuadRow], p: str, c1: str, whole: bool = False) -> None:
        """Columns p .. p + width - 1 of the group's rows; `whole`: all below c1, so the weight rows
        are one base and constant offsets (one register for eight rows), else those past c1 repeat
        the last."""
        cols, rows = _quad_rows(fn, p, c1, width, rb, whole)
        limit = None  # chain: the last byte of the call's columns, from this quad's first row
        if chain:
            cols_left = fn.v(f"sub i64 {c1}, {p}")
            limit = fn.v(f"sub i64 {fn.v(f'mul i64 {cols_left}, {rb}')}, 1")

        def block(b: str, accs: list[str]) -> list[str]:
            at = fn.v(f"mul i64 {b}, {bb}")
            if QUAD_PREFETCH_BYTES:  # the rows are one span: walk it `width` times as fast, whole steps ahead
                ahead_at = fn.v(f"add i64 {fn.v(f'mul i64 {b}, {width * bb}')}, {ahead}")
                for line in range(_prefetch_lines(layout, width)):
                    off = ahead_at if not line else fn.v(f"add i64 {ahead_at}, {64 * line}")
                    fn.prefetch(rows[0], _at_most(fn, off, limit) if chain else off)
            w = [fn.gep(row, at) for row in rows]
            pbs = [decode_pair(fn, w[j], w[j + 1]) for j in range(0, width, 2)]
            d, m = _quad_scales(fn, layout, pbs, w)
            return [v for g, row in enumerate(group) for v in row_dot(row, b, pbs, d, m, accs[g * per:(g + 1) * per])]

        finals = fn.loop(0, nb, [(vf, "zeroinitializer")] * (per * len(group)), block)
        for g, row in enumerate(group):
            acc = finals[g * per] if per == 1 else fn.v(f"fadd {vf} {finals[g * per]}, {finals[g * per + 1]}")
            for lane, c in enumerate(_lane_columns(width)):
                y = fn.v(f"extractelement {vf} {acc}, i64 {lane}")
                fn.store("float", y, fn.gep(row.out, cols[c], "float"), 4)

    def quad_row(r: str, g: int) -> QuadRow:
        row_corr = None
        if offset:
            row_corr = fn.gep(corr, g * (k // 8), "i32") if g else corr
            _fill_folded(fn, layout, variant, k, r, row_corr)
        return QuadRow(
            x=fn.gep("%xq", fn.v(f"mul i64 {r}, {k}")),
            dx=fn.gep("%xd", fn.v(f"mul i64 {r}, {nb}"), "float"),
            sx=fn.gep("%xe", fn.v(f"mul i64 {r}, {nb}"), "float") if layout.has_min else None,
            out=fn.gep("%out", fn.v(f"mul i64 {r}, %ldo"), "float"),
            corr=row_corr,
        )

    def chunk(c0: str, c1: str) -> None:
        start = c0  # chain: the whole quads [c0, start) run in row groups, the last partial quad per row
        if chain:
            _lead_in(fn, c0, c1, rb, ahead)
            span = fn.v(f"sub i64 {c1}, {c0}")
            start = fn.v(f"add i64 {c0}, {fn.v(f'and i64 {span}, {-width}')}")

        def rows_of(size: int):
            def body(r: str, _c2: list[str]) -> list[str]:
                group = [quad_row(r if not g else fn.v(f"add i64 {r}, {g}"), g) for g in range(size)]
                if chain:
                    fn.loop(c0, start, [], lambda p, _c3: quad(group, p, c1, True) or [], step=width)
                else:
                    fn.loop(c0, c1, [], lambda p, _c3: quad(group, p, c1) or [], step=width)
                return []

            return body

        first = first_row
        for size in (*QUAD_GROUPS, 1):  # groups of each size while they fill, then the next size
            left = fn.v(f"sub i64 %m, {first}")
            whole = fn.v(f"mul i64 {fn.v(f'sdiv i64 {left}, {size}')}, {size}")
            end = fn.v(f"add i64 {first}, {whole}")
            fn.loop(first, end, [], rows_of(size), step=size)
            first = end
        if chain:  # the columns left (at most one quad, whose last repeat), each row alone
            fn.loop(first_row, "%m", [], lambda r, _c2: fn.loop(
                start, c1, [], lambda p, _c3: quad([quad_row(r, 0)], p, c1) or [], step=width) and [])

    column_chunks(fn, step, chunk)
