"""Renders the quantized matmul kernel: y[r, n] = sum_b (weight block b of row n) . (activation row r).

Owns: the loops and the order of summation. One kernel per (weight type, K, variant, row tile):

    for each chunk of ~128 KB of weight rows in [n0, n1):        # threads split [n0, n1)
        for each full tile of T activation rows (T > 1):
            copy the tile's d_x (and s) into a [block][row] scratch, once per tile and chunk
            for n in the chunk:
                for b in blocks of K:       # the weight block is decoded once per tile
    leftover rows (all rows when M < T, e.g. decode), each alone:
        block-32 types: for each leftover row (column chunks of ~128 KB when several rows are left):
            for n, n+1 in column pairs of [n0, n1):     # two weight rows per vector, see _pairs
                for b in blocks of K: (per row as below)
            IQ4_NL, MXFP4: columns n .. n+3 at once instead, one <4 x float> chain (see _quads)
        k-quants: for n in [n0, n1), for each leftover row:
            for b in blocks of K:
                per row: isum = sum over the block's chunks of lane_scale * dot8  (exact int32 lanes)
                         isum -= offset * (sum of each 4 activations)             (Q4_0, Q5_0, Q8_0 on VNNI)
                         isum -= pair sums of offsets * xsum16                    (Q6_K)
                "lanes" order (Q4_0 .. Q8_0, Q3_K, Q5_K, Q6_K, IQ4_XS: ggml's vec-dots):
                         acc  = fma(d_w * d_x, float(isum), acc)                  (8 float lanes)
                         accm = accm + m * s_x           (Q4_1/Q5_1)
                         accm = fma(-(dmin * d_x), float(sum_j min_j * bsum_j), accm)   (Q5_K)
                "scalar" order (Q2_K, Q4_K, IQ4_NL, MXFP4: ggml's repacked gemvs):
                         acc  = fma(float(sum of isum lanes), d_w * d_x, acc)     (one float)
                         accm = fma(float(sum_j min_j * bsum_j), dmin * d_x, accm)      (Q2_K, Q4_K)
            lanes:  y[r, n] = ((acc0+acc4) + (acc2+acc6)) + ((acc1+acc5) + (acc3+acc7)) + accm
            scalar: y[r, n] = acc - accm  (acc without a minimum)

These are `kinetic.ir.numerics.matmul`'s float operations in its order (the kernels llama.cpp runs
for a decode row on x86), so every kernel gives the reference bit for bit. Table-coded weights
(IQ4_NL, IQ4_XS, MXFP4) are looked up per block (`vpshufb`), signed ones multiplied through
|w| and x with w's sign where pmaddubsw takes them.
In a tile the per-row float operations run as 8-row vectors (d_w * d_x for 8 rows in one multiply,
Q4_1/Q5_1's m * s and Q4_K's two fmas on 8 rows' accumulators, Q4_K's integer lane sums of 8 rows
reduced together by a transpose-add tree), each lane one row's own operation on the same operands.
Integer sums are exact, so how they are grouped (k-quant scales through pmaddubsw + vpdpwssd, two
accumulator chains; Q4_K alone on VNNI through 512-bit vectors; weights with an offset taken unsigned,
the offset times the activations' sums of 4 precomputed once per row and used as vpdpbusd's starting
value) is free.
Decode (a row alone) of block-32 types runs two adjacent weight rows at once (`_pairs`): one fma
chain per row is latency-bound at 4 cycles per block, two rows' chains in one vector are not (four
for the scalar order, `_quads`, whose tiles keep rows in lanes instead: `_interleave`).
A row's float operations are the same sequence whatever T, M, [n0, n1) or the variant, so results
are bit-identical across batch sizes, tilings, thread counts and variants. The reduction dimension is
never split.
"""

from __future__ import annotations

from dataclasses import replace

from kinetic.codegen.cpu.llvm_ir import Function, const_vec, module, splat
from kinetic.codegen.cpu.quant_blocks import LAYOUTS, Block, Layout
from kinetic.codegen.cpu.target import DECLARATIONS, dot8, dot8_acc, dot8_scaled

FLOAT_DECLARATIONS = [
    "declare <8 x float> @llvm.fma.v8f32(<8 x float>, <8 x float>, <8 x float>)",
    "declare float @llvm.fma.f32(float, float, float)",
    "declare <2 x float> @llvm.fma.v2f32(<2 x float>, <2 x float>, <2 x float>)",
    "declare i32 @llvm.vector.reduce.add.v8i32(<8 x i32>)",
    "declare i32 @llvm.vector.reduce.add.v16i32(<16 x i32>)",
    "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)",
    "declare <4 x float> @llvm.fma.v4f32(<4 x float>, <4 x float>, <4 x float>)",
]
# the 16-entry table lookups of IQ4_NL, IQ4_XS and MXFP4 (vpshufb; the generic variant selects)
LOOKUP_DECLARATIONS = {
    "vnni": ["declare <32 x i8> @llvm.x86.avx2.pshuf.b(<32 x i8>, <32 x i8>)"],
    "avx2": ["declare <32 x i8> @llvm.x86.avx2.pshuf.b(<32 x i8>, <32 x i8>)"],
    "generic": [],
}

PARAMS = [
    ("ptr", "w"),  # u8 [N, row_bytes]
    ("ptr", "xq"),  # i8 [M, K]
    ("ptr", "xd"),  # f32 [M, K/block]
    ("ptr", "xe"),  # q8_1: f32 s [M, K/32]; q8_k: i32 sums of 16 [M, K/16]; else unused
    ("ptr", "out"),  # f32 [M, ldo]
    ("i64", "m"),
    ("i64", "n0"),
    ("i64", "n1"),
    ("i64", "ldo"),
]


def kernel_name(layout: Layout, k: int, variant: str, tile: int) -> str:
    return f"kin_mm_{layout.wtype.name.lower()}_k{k}_{variant}_t{tile}"


def _row_offset(layout: Layout, variant: str) -> int:
    """The weight offset the kernel subtracts through activation sums (0: none). Q8_0's is 128 (its
    signed bytes flipped to unsigned) on VNNI only: AVX2's pmaddubsw would saturate on 255 * 127 * 2."""
    return layout.offset if layout.offset < 128 or variant == "vnni" else 0


def _fill_corrections(fn: Function, layout: Layout, variant: str, k: int, r: str, dst: str) -> None:
    """dst[b] <- <8 x i32>: -offset * (the sum of each 4 activations of block b of row r), exact."""
    off = _row_offset(layout, variant)
    xq = fn.gep("%xq", fn.v(f"mul i64 {r}, {k}"))
    ones = splat("i8", off if off < 128 else off - 256)

    def body(b: str, _c: list[str]) -> list[str]:
        x = fn.load("<32 x i8>", fn.gep(xq, fn.v(f"mul i64 {b}, 32")))
        total = dot8(fn, variant, ones, x, False)
        neg = fn.v(f"sub <8 x i32> zeroinitializer, {total}")
        fn.store("<8 x i32>", neg, fn.gep(dst, fn.v(f"mul i64 {b}, 8"), "i32"), 32)
        return []

    fn.loop(0, k // 32, [], body)


class _Rows:
    """Per-row pointers into the quantized activations (and the row's offset corrections, if any)."""

    def __init__(self, fn: Function, r: str, k: int, layout: Layout, corr: str | None = None):
        self.r = r
        self.corr = corr
        self.xq = fn.gep("%xq", fn.v(f"mul i64 {r}, {k}"))
        self.xd = fn.gep("%xd", fn.v(f"mul i64 {r}, {k // layout.block}"), "float")
        extra = {"q8_1": (k // 32, "float"), "q8_k": (k // 16, "i32")}.get(layout.activation)
        self.xe = fn.gep("%xe", fn.v(f"mul i64 {r}, {extra[0]}"), extra[1]) if extra else None


CHAINS = 2


def _block_dot(fn: Function, variant: str, blk: Block, row: _Rows, b: str, block: int) -> str:
    """<8 x i32> exact lane sums of one weight block against one activation row."""
    base = fn.gep(row.xq, fn.v(f"mul i64 {b}, {block}"))
    total = None
    chains = ["zeroinitializer"] * CHAINS  # independent integer accumulators: shorter latency chains
    for c, chunk in enumerate(blk.chunks):
        x = fn.load("<32 x i8>", fn.gep(base, 32 * c))
        if chunk.scale16 is not None and variant != "generic":
            w = chunk.w
            if chunk.signed:  # |w| <= 127 against x with w's sign: pmaddubsw's pairs stay below 2^15
                w, x = _sign_split(fn, w, x)
            chains[c % CHAINS] = dot8_scaled(fn, variant, chains[c % CHAINS], w, x, chunk.scale16)
            if c == len(blk.chunks) - 1:
                total = chains[0]
                for other in chains[1 : len(blk.chunks)]:
                    total = fn.v(f"add <8 x i32> {total}, {other}")
                if blk.scale16_shift:  # the scales were 2^shift too large: exact multiples, shift back
                    total = fn.v(f"ashr <8 x i32> {total}, {splat('i32', blk.scale16_shift)}")
            continue
        if row.corr is not None:  # unsigned weights (flipped if signed) minus offset * quad sums
            w = fn.v(f"xor <32 x i8> {chunk.w}, {splat('i8', -128)}") if chunk.signed else chunk.w
            corr = fn.load("<8 x i32>", fn.gep(row.corr, fn.v(f"mul i64 {b}, 8"), "i32"), 32)
            p = dot8_acc(fn, variant, corr, w, x, False)
        else:
            p = dot8(fn, variant, chunk.w, x, chunk.signed)
        if chunk.lane_scale is not None:
            p = fn.v(f"mul <8 x i32> {p}, {chunk.lane_scale}")
        total = p if total is None else fn.v(f"add <8 x i32> {total}, {p}")
    if blk.offsets is not None:  # lane l -= offsets[2l] * xsum16[2l] + offsets[2l+1] * xsum16[2l+1]
        prod = fn.v(f"mul <16 x i32> {blk.offsets}, {_sums16(fn, row, b)}")
        even = fn.v(f"shufflevector <16 x i32> {prod}, <16 x i32> poison, {const_vec('i32', range(0, 16, 2))}")
        odd = fn.v(f"shufflevector <16 x i32> {prod}, <16 x i32> poison, {const_vec('i32', range(1, 16, 2))}")
        total = fn.v(f"sub <8 x i32> {total}, {fn.v(f'add <8 x i32> {even}, {odd}')}")
    return total


def _sums16(fn: Function, row: _Rows, b: str) -> str:
    """<16 x i32>: the Q8_K sums of 16 activations of super-block b."""
    return fn.load("<16 x i32>", fn.gep(row.xe, fn.v(f"mul i64 {b}, 16"), "i32"), 4)


def _min_dot(fn: Function, blk: Block, row: _Rows, b: str) -> str:
    """i32: sum_j mins[j] * (sum of the activations of sub-block j), exact."""
    prod = fn.v(f"mul <16 x i32> {blk.mins}, {_sums16(fn, row, b)}")
    return fn.v(f"call i32 @llvm.vector.reduce.add.v16i32(<16 x i32> {prod})")


def _min_term(fn: Function, layout: Layout, blk: Block, row: _Rows, b: str, dx: str, accm: str) -> str:
    if layout.activation == "q8_1":  # + m * s
        s = fn.load("float", fn.gep(row.xe, b, "float"), 4)
        return fn.v(f"fadd float {accm}, {fn.v(f'fmul float {blk.min_scale}, {s}')}")
    # ggml_vec_dot_q5_K_q8_K: summs += (-d_x * dmin) * isum, contracted to one fma by GCC
    neg = fn.v(f"fneg float {fn.v(f'fmul float {blk.min_scale}, {dx}')}")
    return _fma(fn, neg, fn.v(f"sitofp i32 {_min_dot(fn, blk, row, b)} to float"), accm)


def _fma(fn: Function, a: str, b: str, c: str) -> str:
    return fn.v(f"call float @llvm.fma.f32(float {a}, float {b}, float {c})")


def _accumulate_scalar(fn: Function, blk: Block, row: _Rows, b: str, isum: str, dx: str, acc: str, accm: str):
    """Q4_K as ggml_gemv_q4_K_8x8_q8_K: acc = fma(float(iacc), d_w*d_x, acc),
    accm = fma(float(imin), dmin*d_x, accm), with iacc and imin exact int32 per super-block."""
    iacc = fn.v(f"call i32 @llvm.vector.reduce.add.v8i32(<8 x i32> {isum})")
    acc = _fma(fn, fn.v(f"sitofp i32 {iacc} to float"), fn.v(f"fmul float {blk.d}, {dx}"), acc)
    if blk.mins is None:  # IQ4_NL, MXFP4: no minimum
        return acc, None
    imin = fn.v(f"sitofp i32 {_min_dot(fn, blk, row, b)} to float")
    accm = _fma(fn, imin, fn.v(f"fmul float {blk.min_scale}, {dx}"), accm)
    return acc, accm


def _scalar_pairs(layout: Layout, variant: str) -> bool:
    """A row alone of a scalar-order type with minimums carries [acc, accm] as one <2 x float> (x86)."""
    return layout.float_order == "scalar" and layout.has_min and variant != "generic"


def _accumulate_scalar_pair(fn: Function, blk: Block, row: _Rows, b: str, isum: str, dx: str, acc2: str) -> str:
    """The scalar order's two fmas as the lanes of one: [acc, accm] = fma([f32(iacc), f32(imin)],
    [d_w * d_x, dmin * d_x], [acc, accm]); imin's products by one `vpmaddwd` on 16-bit mins and Q8_K
    sums (|sum of 16 int8| < 2^15), and iacc, imin reduced by one shuffle tree (all exact)."""
    sums = fn.v(f"trunc <16 x i32> {_sums16(fn, row, b)} to <16 x i16>")
    mins = fn.v(f"trunc <16 x i32> {blk.mins} to <16 x i16>")
    m8 = fn.v(f"call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> {mins}, <16 x i16> {sums})")
    ints = fn.v(f"sitofp <2 x i32> {_reduce_pair(fn, isum, m8)} to <2 x float>")
    ds = fn.v(f"insertelement <2 x float> {fn.v(f'insertelement <2 x float> poison, float {blk.d}, i64 0')}, "
              f"float {blk.min_scale}, i64 1")
    scale = fn.v(f"fmul <2 x float> {ds}, {fn.splat_value(2, 'float', dx)}")
    return fn.v(f"call <2 x float> @llvm.fma.v2f32(<2 x float> {ints}, <2 x float> {scale}, <2 x float> {acc2})")


def _reduce_pair(fn: Function, a: str, c: str) -> str:
    """<2 x i32> [sum of a's 8 lanes, sum of c's 8 lanes] (exact)."""
    lo = fn.v(f"shufflevector <8 x i32> {a}, <8 x i32> {c}, {const_vec('i32', [0, 1, 2, 3, 8, 9, 10, 11])}")
    hi = fn.v(f"shufflevector <8 x i32> {a}, <8 x i32> {c}, {const_vec('i32', [4, 5, 6, 7, 12, 13, 14, 15])}")
    v = fn.v(f"add <8 x i32> {lo}, {hi}")
    for swap in ([2, 3, 0, 1, 6, 7, 4, 5], [1, 0, 3, 2, 5, 4, 7, 6]):
        mask = const_vec("i32", swap)
        v = fn.v(f"add <8 x i32> {v}, {fn.v(f'shufflevector <8 x i32> {v}, <8 x i32> poison, {mask}')}")
    return fn.v(f"shufflevector <8 x i32> {v}, <8 x i32> poison, {const_vec('i32', [0, 4])}")


def _accumulate_wide(fn: Function, layout: Layout, row: _Rows, wrow: str, b: str, acc: str) -> str:
    """Q4_K on VNNI, one row: <2 x float> [acc, accm] <- fma([float(iacc), float(imin)],
    [d_w * d_x, dmin * d_x], [acc, accm]): the scalar order's two fmas as the lanes of one. 512-bit
    pmaddubsw + vpdpwssd over 64 weights at a time, and the integer totals iacc, imin reduced together."""
    blk_ptr = fn.gep(wrow, fn.v(f"mul i64 {b}, {layout.block_bytes}"))
    blk = layout.decode_wide(fn, blk_ptr)
    xb = fn.gep(row.xq, fn.v(f"mul i64 {b}, 256"))
    chains = ["zeroinitializer"] * 2
    for p in range(4):
        x = fn.load("<64 x i8>", fn.gep(xb, 64 * p))
        pairs = fn.v(f"call <32 x i16> @llvm.x86.avx512.pmaddubs.w.512(<64 x i8> {blk.quants[p]}, <64 x i8> {x})")
        chains[p % 2] = fn.v(f"call <16 x i32> @llvm.x86.avx512.vpdpwssd.512(<16 x i32> {chains[p % 2]}, "
                             f"<32 x i16> {pairs}, <32 x i16> {blk.scales[p]})")
    t16 = fn.v(f"add <16 x i32> {chains[0]}, {chains[1]}")
    sums = fn.v(f"trunc <16 x i32> {_sums16(fn, row, b)} to <16 x i16>")  # |sum of 16 int8| < 2^15
    m8 = fn.v(f"call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> {blk.mins}, <16 x i16> {sums})")
    ints = fn.v(f"sitofp <2 x i32> {_reduce_pair(fn, _fold16(fn, t16), m8)} to <2 x float>")
    dmin = fn.v(f"fpext <2 x half> {fn.load('<2 x half>', blk_ptr)} to <2 x float>")
    dx = fn.load("float", fn.gep(row.xd, b, "float"), 4)
    scale = fn.v(f"fmul <2 x float> {dmin}, {fn.splat_value(2, 'float', dx)}")
    return fn.v(f"call <2 x float> @llvm.fma.v2f32(<2 x float> {ints}, <2 x float> {scale}, <2 x float> {acc})")


def _lookup(fn: Function, variant: str, table: list[int], idx: str) -> str:
    """<32 x i8>: table[idx] for 4-bit indices. x86: one `vpshufb` (the 16 values in each 128-bit
    lane); generic: a tree of 15 selects on the index bits (LLVM has no portable byte shuffle)."""
    if variant != "generic":
        values = const_vec("i8", [v - 256 if v > 127 else v for v in table] * 2)
        return fn.v(f"call <32 x i8> @llvm.x86.avx2.pshuf.b({values}, <32 x i8> {idx})")
    level = [splat("i8", v - 256 if v > 127 else v) for v in table]
    for bit in range(4):
        masked = fn.v(f"and <32 x i8> {idx}, {splat('i8', 1 << bit)}")
        on = fn.v(f"icmp ne <32 x i8> {masked}, zeroinitializer")
        pairs = zip(level[0::2], level[1::2], strict=True)
        level = [fn.v(f"select <32 x i1> {on}, <32 x i8> {hi}, <32 x i8> {lo}") for lo, hi in pairs]
    return level[0]


def _table(fn: Function, variant: str, table: tuple[int, ...], idx: str, offset: int) -> tuple[str, bool]:
    """(weights, signed) of table-coded indices: the table itself (signed), or, when the kernel applies
    the layout's offset through the activation sums, the table plus the offset (unsigned)."""
    if offset:
        return _lookup(fn, variant, [(v + offset) & 255 for v in table], idx), False
    return _lookup(fn, variant, list(table), idx), True


def _decode(fn: Function, layout: Layout, variant: str, ptr: str) -> Block:
    """The block at ptr with table-coded chunks looked up (once per block, whatever the rows)."""
    blk = layout.decode(fn, ptr)
    offset = _row_offset(layout, variant)
    chunks = []
    for chunk in blk.chunks:
        if chunk.table is not None:
            w, signed = _table(fn, variant, chunk.table, chunk.w, offset)
            chunk = replace(chunk, w=w, signed=signed, table=None)
        chunks.append(chunk)
    return replace(blk, chunks=chunks)


def _sign_split(fn: Function, w: str, x: str) -> tuple[str, str]:
    """(|w|, x with w's sign): the unsigned and signed operands of pmaddubsw with the products w*x."""
    a = fn.v(f"call <32 x i8> @llvm.abs.v32i8(<32 x i8> {w}, i1 false)")
    return a, fn.v(f"call <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8> {x}, <32 x i8> {w})")


def _accumulate(fn: Function, layout: Layout, variant: str, rows: list[_Rows], wrow: str, b: str, accs: list[str]):
    blk = _decode(fn, layout, variant, fn.gep(wrow, fn.v(f"mul i64 {b}, {layout.block_bytes}")))
    new_acc, new_min = [], []
    for i, row in enumerate(rows):
        isum = _block_dot(fn, variant, blk, row, b, layout.block)
        dx = fn.load("float", fn.gep(row.xd, b, "float"), 4)
        if _scalar_pairs(layout, variant):  # accs[i] = <2 x float> [acc, accm]
            new_acc.append(_accumulate_scalar_pair(fn, blk, row, b, isum, dx, accs[i]))
            continue
        if layout.float_order == "scalar":
            accm = accs[len(rows) + i] if layout.has_min else None
            acc, accm = _accumulate_scalar(fn, blk, row, b, isum, dx, accs[i], accm)
            new_acc.append(acc)
            new_min += [accm] if layout.has_min else []
            continue
        scale = fn.splat_value(8, "float", fn.v(f"fmul float {blk.d}, {dx}"))
        lanes = fn.v(f"sitofp <8 x i32> {isum} to <8 x float>")
        new_acc.append(
            fn.v(f"call <8 x float> @llvm.fma.v8f32(<8 x float> {scale}, <8 x float> {lanes}, <8 x float> {accs[i]})")
        )
        if layout.has_min:
            new_min.append(_min_term(fn, layout, blk, row, b, dx, accs[len(rows) + i]))
    return new_acc + new_min


def _hsum(fn: Function, acc: str) -> str:
    """Fixed-tree sum of 8 float lanes."""
    lo = fn.v(f"shufflevector <8 x float> {acc}, <8 x float> poison, {const_vec('i32', range(4))}")
    hi = fn.v(f"shufflevector <8 x float> {acc}, <8 x float> poison, {const_vec('i32', range(4, 8))}")
    s4 = fn.v(f"fadd <4 x float> {lo}, {hi}")
    a = fn.v(f"shufflevector <4 x float> {s4}, <4 x float> poison, {const_vec('i32', [0, 1])}")
    b = fn.v(f"shufflevector <4 x float> {s4}, <4 x float> poison, {const_vec('i32', [2, 3])}")
    s2 = fn.v(f"fadd <2 x float> {a}, {b}")
    e0 = fn.v(f"extractelement <2 x float> {s2}, i64 0")
    e1 = fn.v(f"extractelement <2 x float> {s2}, i64 1")
    return fn.v(f"fadd float {e0}, {e1}")


def _row_tile(fn: Function, layout: Layout, variant: str, k: int, wrow: str, n: str, first_row: str, tile: int):
    rows = [_Rows(fn, fn.v(f"add i64 {first_row}, {i}"), k, layout) for i in range(tile)]
    scalar = layout.float_order == "scalar"
    has_min = layout.has_min
    carried = [("float" if scalar else "<8 x float>", "0.0" if scalar else "zeroinitializer")] * tile
    carried += [("float", "0.0")] * tile if has_min else []
    wide = tile == 1 and variant == "vnni" and layout.decode_wide is not None
    paired = wide or _scalar_pairs(layout, variant)
    if paired:
        carried = [("<2 x float>", "zeroinitializer")] * tile

    def step(b: str, accs: list[str]) -> list[str]:
        if wide:
            return [_accumulate_wide(fn, layout, rows[0], wrow, b, accs[0])]
        return _accumulate(fn, layout, variant, rows, wrow, b, accs)

    finals = fn.loop(0, k // layout.block, carried, step)
    if paired:  # [acc of each row] + [accm of each row]
        finals = [fn.v(f"extractelement <2 x float> {f}, i64 {i}") for i in range(2) for f in finals]
    for i, row in enumerate(rows):
        if scalar:
            y = fn.v(f"fsub float {finals[i]}, {finals[tile + i]}") if has_min else finals[i]
        else:
            y = _hsum(fn, finals[i])
            if has_min:
                y = fn.v(f"fadd float {y}, {finals[tile + i]}")
        at = fn.v(f"add i64 {fn.v(f'mul i64 {row.r}, %ldo')}, {n}")
        fn.store("float", y, fn.gep("%out", at, "float"), 4)


def _singles(fn: Function, layout: Layout, variant: str, k: int, n: str, first_row: str) -> None:
    """Column n for rows [first_row, m), one row at a time (decode, M below a tile, leftover rows)."""
    wrow = fn.gep("%w", fn.v(f"mul i64 {n}, {k // layout.block * layout.block_bytes}"))

    def single(r: str, _carried: list[str]) -> list[str]:
        _row_tile(fn, layout, variant, k, wrow, n, r, 1)
        return []

    fn.loop(first_row, "%m", [], single)


# ---- tiles of T > 1 rows: row-tile-major, with the tile's float scales transposed once -------------
#
# For a tile of T rows the kernel first copies the rows' d_x (and Q8_1's s) into a stack scratch
# laid out [block][row] (groups of 8 rows), once per tile and column chunk. Then per weight block the
# products d_w * d_x of 8 rows are one vector multiply, Q4_1/Q5_1's m * s terms one multiply and one
# add on 8 rows' accm, and Q4_K's per-row integer sums are reduced together (a transpose-add tree)
# into 8 rows' lanes before one fma. Each lane is one row's own float operation on the same operands
# as the single-row code, so the per-element sequence is unchanged.

SMALL_TILES = (4, 2)  # leftover rows below a tile (a verification pass's few rows) still share each decoded block
GROUP = 8
CHUNK_BYTES = 128 << 10  # weight bytes of one column chunk: a tile loops over them while they sit in L2


def _transpose_sum(fn: Function, vs: list[str]) -> list[str]:
    """<8 x i32> per 8 inputs: lane i = the sum of input i's 8 lanes (exact; a shuffle-add tree)."""
    even, odd = const_vec("i32", range(0, 16, 2)), const_vec("i32", range(1, 16, 2))
    out = []
    for g in range(0, len(vs), GROUP):
        level = vs[g : g + GROUP] + ["zeroinitializer"] * (GROUP - len(vs[g : g + GROUP]))
        while len(level) > 1:
            nxt = []
            for a, b in zip(level[0::2], level[1::2], strict=True):
                lo = fn.v(f"shufflevector <8 x i32> {a}, <8 x i32> {b}, {even}")
                hi = fn.v(f"shufflevector <8 x i32> {a}, <8 x i32> {b}, {odd}")
                nxt.append(fn.v(f"add <8 x i32> {lo}, {hi}"))
            level = nxt
        out.append(level[0])
    return out


def _fold16(fn: Function, v16: str) -> str:
    lo = fn.v(f"shufflevector <16 x i32> {v16}, <16 x i32> poison, {const_vec('i32', range(8))}")
    hi = fn.v(f"shufflevector <16 x i32> {v16}, <16 x i32> poison, {const_vec('i32', range(8, 16))}")
    return fn.v(f"add <8 x i32> {lo}, {hi}")


def _min_lanes(fn: Function, blk: Block, row: _Rows, b: str) -> str:
    """<8 x i32> whose lanes sum to sum_j mins[j] * bsum_j (exact)."""
    return _fold16(fn, fn.v(f"mul <16 x i32> {blk.mins}, {_sums16(fn, row, b)}"))


def _fma8(fn: Function, a: str, b: str, c: str) -> str:
    return fn.v(f"call <8 x float> @llvm.fma.v8f32(<8 x float> {a}, <8 x float> {b}, <8 x float> {c})")


def _tile_block(fn, layout, variant, rows, groups, wrow, b, dxt, st, accs):
    """One block for T rows. accs: lanes: T row accs (+ groups accm); scalar: groups acc + groups accm."""
    t = len(rows)
    blk = _decode(fn, layout, variant, fn.gep(wrow, fn.v(f"mul i64 {b}, {layout.block_bytes}")))
    isums = [_block_dot(fn, variant, blk, row, b, layout.block) for row in rows]
    base = fn.v(f"mul i64 {b}, {GROUP * groups}")

    def group_vec(src: str, g: str) -> str:
        return fn.load("<8 x float>", fn.gep(src, fn.v(f"add i64 {base}, {GROUP * g}"), "float"), 32)

    dxv = [group_vec(dxt, g) for g in range(groups)]
    if layout.float_order == "scalar":
        iacc = _transpose_sum(fn, isums)
        d8 = fn.splat_value(8, "float", blk.d)
        acc, accm = [], []
        for g in range(groups):
            fa = fn.v(f"sitofp <8 x i32> {iacc[g]} to <8 x float>")
            acc.append(_fma8(fn, fa, fn.v(f"fmul <8 x float> {d8}, {dxv[g]}"), accs[g]))
        if not layout.has_min:
            return acc
        imin = _transpose_sum(fn, [_min_lanes(fn, blk, row, b) for row in rows])
        m8 = fn.splat_value(8, "float", blk.min_scale)
        for g in range(groups):
            fm = fn.v(f"sitofp <8 x i32> {imin[g]} to <8 x float>")
            accm.append(_fma8(fn, fm, fn.v(f"fmul <8 x float> {m8}, {dxv[g]}"), accs[groups + g]))
        return acc + accm
    d8 = fn.splat_value(8, "float", blk.d)
    new = []
    for i in range(t):  # d_w * d_x of row i in all 8 lanes: a broadcast load and one multiply
        dx = fn.load("float", fn.gep(dxt, fn.v(f"add i64 {base}, {i}"), "float"), 4)
        scale = fn.v(f"fmul <8 x float> {d8}, {fn.splat_value(8, 'float', dx)}")
        lanes = fn.v(f"sitofp <8 x i32> {isums[i]} to <8 x float>")
        new.append(_fma8(fn, scale, lanes, accs[i]))
    if layout.has_min:
        m8 = fn.splat_value(8, "float", blk.min_scale)
        for g in range(groups):
            accm = accs[t + g]
            if layout.activation == "q8_1":  # + m * s
                new.append(fn.v(f"fadd <8 x float> {accm}, {fn.v(f'fmul <8 x float> {m8}, {group_vec(st, g)}')}"))
            else:  # - (dmin * d_x) * float(sum_j min_j * bsum_j)
                rs = rows[GROUP * g : GROUP * g + GROUP]
                imin = _transpose_sum(fn, [_min_lanes(fn, blk, row, b) for row in rs])[0]
                neg = fn.v(f"fneg <8 x float> {fn.v(f'fmul <8 x float> {m8}, {dxv[g]}')}")
                new.append(_fma8(fn, neg, fn.v(f"sitofp <8 x i32> {imin} to <8 x float>"), accm))
    return new


def _transpose_scales(fn: Function, src: str, per_row: int, first_row: str, t: int, groups: int, dst: str) -> None:
    """dst[b][row] (groups of 8 rows, zero-padded) <- src[first_row + row][b] for b < per_row."""

    def body(b: str, _c: list[str]) -> list[str]:
        for g in range(groups):
            v = "zeroinitializer"
            for i in range(GROUP * g, min(t, GROUP * g + GROUP)):
                r = fn.v(f"add i64 {first_row}, {i}")
                x = fn.load("float", fn.gep(src, fn.v(f"add i64 {fn.v(f'mul i64 {r}, {per_row}')}, {b}"), "float"), 4)
                v = fn.v(f"insertelement <8 x float> {v}, float {x}, i64 {i % GROUP}")
            at = fn.v(f"add i64 {fn.v(f'mul i64 {b}, {GROUP * groups}')}, {GROUP * g}")
            fn.store("<8 x float>", v, fn.gep(dst, at, "float"), 32)
        return []

    fn.loop(0, per_row, [], body)


# ---- tiles of block-32 "scalar" types (IQ4_NL, MXFP4): rows in lanes ---------------------------------
#
# The gemv order needs each row's whole-block integer total before its fma. Reducing 8 rows' dot8
# lanes by a transpose tree costs more than the dots; instead the tile's activations are laid out
# once per tile (and column chunk) with row r's bytes 4g..4g+3 of block b in dword r of vector g
# (`_interleave`), so that dot8(broadcast of weight dword g, vector g), summed over g, leaves row r's
# total in lane r: 8 vpdpbusd per block for 8 rows and no reduction. Offset types start from
# -offset * (row r's block sum) in lane r, computed with the layout.

def _transpose8(fn: Function, vecs: list[str]) -> list[str]:
    """8 <8 x i32> rows -> 8 columns (a butterfly of shuffles: at stage `bit`, lanes with that bit set
    in vector i trade places with lanes without it in vector i | bit)."""
    for bit in (1, 2, 4):
        out = list(vecs)
        for i in range(8):
            if i & bit:
                continue
            lo = [j if not j & bit else 8 + (j ^ bit) for j in range(8)]
            hi = [j ^ bit if not j & bit else 8 + j for j in range(8)]
            out[i] = fn.v(f"shufflevector <8 x i32> {vecs[i]}, <8 x i32> {vecs[i | bit]}, {const_vec('i32', lo)}")
            out[i | bit] = fn.v(f"shufflevector <8 x i32> {vecs[i]}, <8 x i32> {vecs[i | bit]}, {const_vec('i32', hi)}")
        vecs = out
    return vecs


def _interleave(fn: Function, layout: Layout, variant: str, k: int, first: str, tile: int, xi: str,
                xcorr: str | None) -> None:
    """xi[group][b][g] <- <32 x i8>: bytes 4g..4g+3 of block b of the group's 8 rows, row r in dword r
    (rows past the tile zero); xcorr[group][b] <- <8 x i32>: -offset * (row r's sum over block b)."""
    nb, off = k // 32, _row_offset(layout, variant)
    ones = splat("i8", off if off < 128 else off - 256)

    def body(b: str, _c: list[str]) -> list[str]:
        for grp in range(-(-tile // GROUP)):
            rows = []
            for i in range(GROUP * grp, GROUP * grp + GROUP):
                if i >= tile:
                    rows.append("zeroinitializer")
                    continue
                r = fn.v(f"add i64 {first}, {i}")
                at = fn.v(f"add i64 {fn.v(f'mul i64 {r}, {k}')}, {fn.v(f'mul i64 {b}, 32')}")
                rows.append(fn.load("<8 x i32>", fn.gep("%xq", at)))
            at = fn.v(f"add i64 {b}, {grp * nb}")
            start = "zeroinitializer"
            for g, col in enumerate(_transpose8(fn, rows)):
                xg = fn.v(f"bitcast <8 x i32> {col} to <32 x i8>")
                fn.store("<32 x i8>", xg, fn.gep(xi, fn.v(f"add i64 {fn.v(f'mul i64 {at}, 256')}, {32 * g}")), 32)
                if off:
                    start = dot8_acc(fn, variant, start, ones, xg, False)
            if off:
                neg = fn.v(f"sub <8 x i32> zeroinitializer, {start}")
                fn.store("<8 x i32>", neg, fn.gep(xcorr, fn.v(f"mul i64 {at}, 8"), "i32"), 32)
        return []

    fn.loop(0, nb, [], body)


def _tile_block_interleaved(fn: Function, layout: Layout, variant: str, k: int, groups: int, wrow: str, b: str,
                            dxt: str, xi: str, xcorr: str | None, accs: list[str]) -> list[str]:
    """One block for the tile's rows as lanes: acc = fma(float(row totals), d_w * d_x, acc) per group."""
    nb = k // 32
    blk = _decode(fn, layout, variant, fn.gep(wrow, fn.v(f"mul i64 {b}, {layout.block_bytes}")))
    (chunk,) = blk.chunks
    w32 = fn.v(f"bitcast <32 x i8> {chunk.w} to <8 x i32>")
    wg = []
    for g in range(8):
        splat_g = fn.v(f"shufflevector <8 x i32> {w32}, <8 x i32> poison, {const_vec('i32', [g] * 8)}")
        wg.append(fn.v(f"bitcast <8 x i32> {splat_g} to <32 x i8>"))
    d8 = fn.splat_value(8, "float", blk.d)
    new = []
    for grp in range(groups):
        at = fn.v(f"add i64 {b}, {grp * nb}")
        xg = [fn.load("<32 x i8>", fn.gep(xi, fn.v(f"add i64 {fn.v(f'mul i64 {at}, 256')}, {32 * g}")), 32)
              for g in range(8)]
        chains = []
        for half in range(2):  # two independent chains of 4, added (exact)
            acc = "zeroinitializer"
            if half == 0 and xcorr is not None:
                acc = fn.load("<8 x i32>", fn.gep(xcorr, fn.v(f"mul i64 {at}, 8"), "i32"), 32)
            for g in range(half, 8, 2):
                acc = dot8_acc(fn, variant, acc, wg[g], xg[g], chunk.signed)
            chains.append(acc)
        total = fn.v(f"sitofp <8 x i32> {fn.v(f'add <8 x i32> {chains[0]}, {chains[1]}')} to <8 x float>")
        base = fn.v(f"add i64 {fn.v(f'mul i64 {b}, {GROUP * groups}')}, {GROUP * grp}")
        dxv = fn.load("<8 x float>", fn.gep(dxt, base, "float"), 32)
        new.append(_fma8(fn, total, fn.v(f"fmul <8 x float> {d8}, {dxv}"), accs[grp]))
    return new


def _column_chunks(fn: Function, step, body) -> None:
    """body(c0, c1) for each chunk [c0, c1) of `step` columns of [n0, n1): rows loop over a chunk's
    weights while they sit in L2."""

    def chunk(c0: str, _c: list[str]) -> list[str]:
        end = fn.v(f"add i64 {c0}, {step}")
        body(c0, fn.v(f"select i1 {fn.v(f'icmp slt i64 {end}, %n1')}, i64 {end}, i64 %n1"))
        return []

    fn.loop("%n0", "%n1", [], chunk, step=step)


def _tiles(fn: Function, layout: Layout, variant: str, k: int, tile: int, dxt: str, st: str | None,
           corr: str | None, inter: tuple[str, str | None] | None = None, start: str = "0") -> str:
    """All full tiles of `tile` rows from row `start` on, over [n0, n1), in column chunks; returns the
    first leftover row. `inter`: the (xi, xcorr) scratch of block-32 scalar types, whose rows run as
    lanes."""
    nb = k // layout.block
    row_bytes = nb * layout.block_bytes
    groups = -(-tile // GROUP)
    chunk = max(1, CHUNK_BYTES // row_bytes)
    tiles = fn.v(f"udiv i64 {fn.v(f'sub i64 %m, {start}')}, {tile}")
    scalar = layout.float_order == "scalar"

    def chunk_body(c0: str, c1: str) -> None:
        def tile_body(tt: str, _c2: list[str]) -> list[str]:
            first = fn.v(f"add i64 {start}, {fn.v(f'mul i64 {tt}, {tile}')}")
            _transpose_scales(fn, "%xd", nb, first, tile, groups, dxt)
            if layout.activation == "q8_1":
                _transpose_scales(fn, "%xe", k // 32, first, tile, groups, st)
            if inter is not None:
                _interleave(fn, layout, variant, k, first, tile, *inter)
            rows = []
            for i in range(tile):
                r = fn.v(f"add i64 {first}, {i}")
                rc = None
                if corr is not None:
                    rc = fn.gep(corr, i * (k // 4), "i32")
                    _fill_corrections(fn, layout, variant, k, r, rc)
                rows.append(_Rows(fn, r, k, layout, rc))

            def column(n: str, _c3: list[str]) -> list[str]:
                wrow = fn.gep("%w", fn.v(f"mul i64 {n}, {row_bytes}"))
                naccs = groups if scalar else tile
                carried = [("<8 x float>", "zeroinitializer")] * (naccs + (groups if layout.has_min else 0))

                def step(b: str, accs: list[str]) -> list[str]:
                    if inter is not None:
                        return _tile_block_interleaved(fn, layout, variant, k, groups, wrow, b, dxt, *inter, accs)
                    return _tile_block(fn, layout, variant, rows, groups, wrow, b, dxt, st, accs)

                finals = fn.loop(0, nb, carried, step)
                for i, row in enumerate(rows):
                    g, lane = divmod(i, GROUP)
                    if scalar:
                        y = fn.v(f"extractelement <8 x float> {finals[g]}, i64 {lane}")
                        if layout.has_min:
                            mm = fn.v(f"extractelement <8 x float> {finals[groups + g]}, i64 {lane}")
                            y = fn.v(f"fsub float {y}, {mm}")
                    else:
                        y = _hsum(fn, finals[i])
                        if layout.has_min:
                            mm = fn.v(f"extractelement <8 x float> {finals[tile + g]}, i64 {lane}")
                            y = fn.v(f"fadd float {y}, {mm}")
                    at = fn.v(f"add i64 {fn.v(f'mul i64 {row.r}, %ldo')}, {n}")
                    fn.store("float", y, fn.gep("%out", at, "float"), 4)
                return []

            fn.loop(c0, c1, [], column)
            return []

        fn.loop(0, tiles, [], tile_body)

    _column_chunks(fn, chunk, chunk_body)
    return fn.v(f"add i64 {start}, {fn.v(f'mul i64 {tiles}, {tile}')}")


# ---- leftover rows of block-32 types (decode): two weight rows at a time ------------------------------
#
# One row's float work per block is a chain of dependent operations (the fma into its accumulator),
# so a column alone runs at the fma latency per block. Two adjacent weight rows (a, c) run together:
# their block b is decoded into one PairBlock, whose two dot8s give [a's lanes 0-3 | c's lanes 0-3]
# and [a's lanes 4-7 | c's lanes 4-7]; the float side is the same per-lane operations, two rows per
# vector: [d_a, m_a, d_c, m_c] converted at once, times the row's [d_x, s_x, d_x, s_x] (a scratch per
# block, so d_w * d_x and m * s are one multiply), then fma(d_w * d_x, float(lanes), acc) on both
# halves and accm + m * s on a vector whose lanes 1 and 3 are a's and c's accm. The final sums are the
# single-row tree ((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7)) + accm, two rows per vector operation.
# An odd last column pairs with itself. A software prefetch reads the pairs PREFETCH_BYTES ahead:
# without it the two interleaved rows defeat the hardware prefetcher (2-4x slower from memory).

PREFETCH_BYTES = 4096  # how far ahead of a pair of rows its software prefetch reads (whole pairs)


def _pair_sum(fn: Function, finals: list[str], has_min: bool) -> str:
    """<2 x float> [y_a, y_c] from the pair's accumulators, each the single-row sequence of fadds."""
    s8 = fn.v(f"fadd <8 x float> {finals[0]}, {finals[1]}")  # lane i: acc_i + acc_(i+4) of a, then of c

    def pick(v: str, n: int, idx: list[int]) -> str:
        return fn.v(f"shufflevector <{n} x float> {v}, <{n} x float> poison, {const_vec('i32', idx)}")

    t4 = fn.v(f"fadd <4 x float> {pick(s8, 8, [0, 1, 4, 5])}, {pick(s8, 8, [2, 3, 6, 7])}")
    y = fn.v(f"fadd <2 x float> {pick(t4, 4, [0, 2])}, {pick(t4, 4, [1, 3])}")
    if has_min:
        y = fn.v(f"fadd <2 x float> {y}, {pick(finals[2], 4, [1, 3])}")
    return y


def _pair_scratch(fn: Function, layout: Layout, variant: str, k: int) -> tuple[str, str | None]:
    """Stack scratch of one row for `_pairs` (allocated in the entry block): [d_x, s_x, d_x, s_x] per
    block and, for offset types, the row's corrections (K bytes together with the scales' K/2)."""
    xs = fn.v(f"alloca float, i64 {4 * (k // 32)}, align 32")
    return xs, fn.v(f"alloca i32, i64 {k // 4}, align 32") if _row_offset(layout, variant) else None


def _pairs(fn: Function, layout: Layout, variant: str, k: int, first_row: str, xs: str, corr: str | None) -> None:
    """Columns [n0, n1) for rows [first_row, m), two columns at a time. With one row (decode) all
    columns run in one sweep; with more, in chunks of ~CHUNK_BYTES so the rows reuse them from L2."""
    nb, bb = k // 32, layout.block_bytes
    rb = nb * bb
    offset = _row_offset(layout, variant)
    cols = fn.v("sub i64 %n1, %n0")
    all_cols = fn.v(f"select i1 {fn.v(f'icmp sgt i64 {cols}, 0')}, i64 {cols}, i64 1")
    several = fn.v(f"icmp sgt i64 {fn.v(f'sub i64 %m, {first_row}')}, 1")
    step = fn.v(f"select i1 {several}, i64 {max(2, CHUNK_BYTES // rb // 2 * 2)}, i64 {all_cols}")
    has_min = layout.has_min
    ahead = -(-PREFETCH_BYTES // (2 * rb)) * 2 * rb
    dup4 = const_vec("i32", [0, 1, 2, 3] * 2)
    dup16 = const_vec("i32", list(range(16)) * 2)

    def fill_scales(r: str) -> None:  # xs[b] = [d_x, s_x, d_x, s_x] (s_x: Q8_1's, else 0)
        xd = fn.gep("%xd", fn.v(f"mul i64 {r}, {nb}"), "float")
        xe = fn.gep("%xe", fn.v(f"mul i64 {r}, {nb}"), "float") if layout.activation == "q8_1" else None

        def body(b: str, _c: list[str]) -> list[str]:
            dx = fn.load("float", fn.gep(xd, b, "float"), 4)
            v = fn.v(f"insertelement <4 x float> zeroinitializer, float {dx}, i64 0")
            if xe is not None:
                v = fn.v(f"insertelement <4 x float> {v}, float {fn.load('float', fn.gep(xe, b, 'float'), 4)}, i64 1")
            v = fn.v(f"shufflevector <4 x float> {v}, <4 x float> poison, {const_vec('i32', [0, 1, 0, 1])}")
            fn.store("<4 x float>", v, fn.gep(xs, fn.v(f"mul i64 {b}, 4"), "float"), 16)
            return []

        fn.loop(0, nb, [], body)

    def pair(xrow: str, orow: str, p: str, c1: str) -> None:
        q = fn.v(f"add i64 {p}, 1")
        last = fn.v(f"sub i64 {c1}, 1")
        q = fn.v(f"select i1 {fn.v(f'icmp slt i64 {q}, {c1}')}, i64 {q}, i64 {last}")
        wa = fn.gep("%w", fn.v(f"mul i64 {p}, {rb}"))
        wc = fn.gep("%w", fn.v(f"mul i64 {q}, {rb}"))

        def block(b: str, accs: list[str]) -> list[str]:
            at = fn.v(f"mul i64 {b}, {bb}")
            if PREFETCH_BYTES:
                fn.prefetch(wa, fn.v(f"add i64 {fn.v(f'mul i64 {b}, {2 * bb}')}, {ahead}"))
            a, c = fn.gep(wa, at), fn.gep(wc, at)
            pb = layout.decode_pair(fn, a, c)
            h = fn.v(f"shufflevector <2 x half> {fn.load('<2 x half>', a)}, <2 x half> {fn.load('<2 x half>', c)}, "
                     f"{const_vec('i32', range(4))}")
            xs4 = fn.load("<4 x float>", fn.gep(xs, fn.v(f"mul i64 {b}, 4"), "float"), 16)
            prod = fn.v(f"fmul <4 x float> {fn.v(f'fpext <4 x half> {h} to <4 x float>')}, {xs4}")
            scale = fn.v(f"shufflevector <4 x float> {prod}, <4 x float> poison, {const_vec('i32', [0] * 4 + [2] * 4)}")
            xb = fn.gep(xrow, fn.v(f"mul i64 {b}, 32"))
            xl = fn.v(f"shufflevector <16 x i8> {fn.load('<16 x i8>', xb)}, <16 x i8> poison, {dup16}")
            xh = fn.v(f"shufflevector <16 x i8> {fn.load('<16 x i8>', fn.gep(xb, 16))}, <16 x i8> poison, {dup16}")
            if offset:
                cb = fn.gep(corr, fn.v(f"mul i64 {b}, 8"), "i32")  # two 16-byte broadcast loads
                cl = fn.v(f"shufflevector <4 x i32> {fn.load('<4 x i32>', cb, 16)}, <4 x i32> poison, {dup4}")
                c_hi = fn.load("<4 x i32>", fn.gep(cb, 4, "i32"), 16)
                ch = fn.v(f"shufflevector <4 x i32> {c_hi}, <4 x i32> poison, {dup4}")
                flip = (lambda w: fn.v(f"xor <32 x i8> {w}, {splat('i8', -128)}")) if pb.signed else (lambda w: w)
                il = dot8_acc(fn, variant, cl, flip(pb.low), xl, False)
                ih = dot8_acc(fn, variant, ch, flip(pb.high), xh, False)
            else:
                il = dot8(fn, variant, pb.low, xl, pb.signed)
                ih = dot8(fn, variant, pb.high, xh, pb.signed)
            new = [_fma8(fn, scale, fn.v(f"sitofp <8 x i32> {v} to <8 x float>"), acc)
                   for v, acc in zip((il, ih), accs[:2], strict=True)]
            if has_min:
                new.append(fn.v(f"fadd <4 x float> {accs[2]}, {prod}"))
            return new

        carried = [("<8 x float>", "zeroinitializer")] * 2 + [("<4 x float>", "zeroinitializer")] * has_min
        y = _pair_sum(fn, fn.loop(0, nb, carried, block), has_min)
        for i, n in enumerate((p, q)):
            e = fn.v(f"extractelement <2 x float> {y}, i64 {i}")
            fn.store("float", e, fn.gep(orow, n, "float"), 4)

    def chunk(c0: str, c1: str) -> None:
        def row(r: str, _c2: list[str]) -> list[str]:
            fill_scales(r)
            if offset:
                _fill_corrections(fn, layout, variant, k, r, corr)
            xrow = fn.gep("%xq", fn.v(f"mul i64 {r}, {k}"))
            orow = fn.gep("%out", fn.v(f"mul i64 {r}, %ldo"), "float")
            fn.loop(c0, c1, [], lambda p, _c3: pair(xrow, orow, p, c1) or [], step=2)
            return []

        fn.loop(first_row, "%m", [], row)

    _column_chunks(fn, step, chunk)


# ---- leftover rows of block-32 "scalar" types (IQ4_NL, MXFP4): four columns at a time ---------------
#
# ggml's repacked gemv keeps one float per output column: per block, acc = fma(float(the block's
# integer total), d_w * d_x, acc). A column alone would wait on that fma's latency every 32 values;
# four columns run as one <4 x float> chain. Columns (n, n+1) and (n+2, n+3) are two PairBlocks; each
# gives, after its two dot8s (the second accumulating onto the first), [n's 4 lanes | n+1's 4 lanes],
# and two shuffle-add levels reduce both to the totals [n, n+2, n+1, n+3], against the scales
# [d_n, d_n+2, d_n+1, d_n+3] * d_x. For offset types (MXFP4; IQ4_NL on VNNI) the first dot starts from
# -offset * (the block's activation quad sums, lanes l and l+4 folded), so each column's total
# includes its offset term exactly once. Columns past the end repeat the last one (same bits stored).

QUAD_REDUCE = ([0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15])


def _fill_folded(fn: Function, layout: Layout, variant: str, k: int, r: str, dst: str) -> None:
    """dst[b] <- <4 x i32>: lane l = -offset * (x_4l + .. + x_4l+3 + x_4l+16 + .. + x_4l+19) of block b."""
    off = _row_offset(layout, variant)
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
        lo, signed = _table(fn, variant, pb.table, lo, offset)
        hi, _ = _table(fn, variant, pb.table, hi, offset)
    if start is not None:
        return dot8_acc(fn, variant, dot8_acc(fn, variant, start, lo, xl, False), hi, xh, False)
    return dot8_acc(fn, variant, dot8(fn, variant, lo, xl, signed), hi, xh, signed)


def _quads(fn: Function, layout: Layout, variant: str, k: int, first_row: str, corr: str | None) -> None:
    """Columns [n0, n1) for rows [first_row, m), four columns at a time (chunks as in `_pairs`)."""
    nb, bb = k // 32, layout.block_bytes
    rb = nb * bb
    offset = _row_offset(layout, variant)
    cols = fn.v("sub i64 %n1, %n0")
    all_cols = fn.v(f"select i1 {fn.v(f'icmp sgt i64 {cols}, 0')}, i64 {cols}, i64 1")
    several = fn.v(f"icmp sgt i64 {fn.v(f'sub i64 %m, {first_row}')}, 1")
    step = fn.v(f"select i1 {several}, i64 {max(4, CHUNK_BYTES // rb // 4 * 4)}, i64 {all_cols}")
    dup16 = const_vec("i32", list(range(16)) * 2)
    dup4 = const_vec("i32", [0, 1, 2, 3] * 2)
    ahead = -(-PREFETCH_BYTES // (4 * rb)) * 4 * rb

    def quad(xrow: str, dxrow: str, orow: str, p: str, c1: str) -> None:
        last = fn.v(f"sub i64 {c1}, 1")
        cols = [p]
        for j in (1, 2, 3):
            q = fn.v(f"add i64 {p}, {j}")
            cols.append(fn.v(f"select i1 {fn.v(f'icmp slt i64 {q}, {c1}')}, i64 {q}, i64 {last}"))
        rows = [fn.gep("%w", fn.v(f"mul i64 {c}, {rb}")) for c in cols]

        def block(b: str, accs: list[str]) -> list[str]:
            at = fn.v(f"mul i64 {b}, {bb}")
            if PREFETCH_BYTES:  # the four rows are one span: walk it four times as fast, whole quads ahead
                fn.prefetch(rows[0], fn.v(f"add i64 {fn.v(f'mul i64 {b}, {4 * bb}')}, {ahead}"))
            w = [fn.gep(row, at) for row in rows]
            pbs = [layout.decode_pair(fn, w[0], w[1]), layout.decode_pair(fn, w[2], w[3])]
            xb = fn.gep(xrow, fn.v(f"mul i64 {b}, 32"))
            xl = fn.v(f"shufflevector <16 x i8> {fn.load('<16 x i8>', xb)}, <16 x i8> poison, {dup16}")
            xh = fn.v(f"shufflevector <16 x i8> {fn.load('<16 x i8>', fn.gep(xb, 16))}, <16 x i8> poison, {dup16}")
            start = None
            if offset:
                folded = fn.load("<4 x i32>", fn.gep(corr, fn.v(f"mul i64 {b}, 4"), "i32"), 16)
                start = fn.v(f"shufflevector <4 x i32> {folded}, <4 x i32> poison, {dup4}")
            v1, v2 = (_pair_dot(fn, variant, pb, xl, xh, start, offset) for pb in pbs)
            s8 = [fn.v(f"shufflevector <8 x i32> {v1}, <8 x i32> {v2}, {const_vec('i32', m)}") for m in QUAD_REDUCE]
            s = fn.v(f"add <8 x i32> {s8[0]}, {s8[1]}")
            t4 = [fn.v(f"shufflevector <8 x i32> {s}, <8 x i32> poison, {const_vec('i32', m)}")
                  for m in ([0, 2, 4, 6], [1, 3, 5, 7])]
            totals = fn.v(f"sitofp <4 x i32> {fn.v(f'add <4 x i32> {t4[0]}, {t4[1]}')} to <4 x float>")
            d4 = fn.v(f"shufflevector <2 x float> {pbs[0].d}, <2 x float> {pbs[1].d}, {const_vec('i32', [0, 2, 1, 3])}")
            dx = fn.load("float", fn.gep(dxrow, b, "float"), 4)
            scale = fn.v(f"fmul <4 x float> {d4}, {fn.splat_value(4, 'float', dx)}")
            return [fn.v(f"call <4 x float> @llvm.fma.v4f32(<4 x float> {totals}, <4 x float> {scale}, "
                         f"<4 x float> {accs[0]})")]

        (acc,) = fn.loop(0, nb, [("<4 x float>", "zeroinitializer")], block)
        for lane, c in enumerate((cols[0], cols[2], cols[1], cols[3])):
            y = fn.v(f"extractelement <4 x float> {acc}, i64 {lane}")
            fn.store("float", y, fn.gep(orow, c, "float"), 4)

    def chunk(c0: str, c1: str) -> None:
        def row(r: str, _c2: list[str]) -> list[str]:
            if offset:
                _fill_folded(fn, layout, variant, k, r, corr)
            xrow = fn.gep("%xq", fn.v(f"mul i64 {r}, {k}"))
            dxrow = fn.gep("%xd", fn.v(f"mul i64 {r}, {nb}"), "float")
            orow = fn.gep("%out", fn.v(f"mul i64 {r}, %ldo"), "float")
            fn.loop(c0, c1, [], lambda p, _c3: quad(xrow, dxrow, orow, p, c1) or [], step=4)
            return []

        fn.loop(first_row, "%m", [], row)

    _column_chunks(fn, step, chunk)


def render_matmul(wtype, k: int, variant: str, tile: int) -> tuple[str, str]:
    """(module IR text, function name) for one specialized kernel."""
    layout = LAYOUTS[wtype]
    if k % layout.block:
        raise ValueError(f"{wtype.name} needs K a multiple of {layout.block}, got {k}")
    fn = Function(kernel_name(layout, k, variant, tile), PARAMS)
    quads = layout.decode_pair is not None and layout.float_order == "scalar"
    pair_scratch = _pair_scratch(fn, layout, variant, k) if layout.decode_pair is not None and not quads else None
    quad_corr = fn.v(f"alloca i32, i64 {k // 8}, align 16") if quads and _row_offset(layout, variant) else None
    first_single = "0"
    if tile > 1:
        size = -(-tile // GROUP) * GROUP * (k // layout.block)
        dxt = fn.v(f"alloca float, i64 {size}, align 32")
        st = None
        if layout.activation == "q8_1":
            st = fn.v(f"alloca float, i64 {-(-tile // GROUP) * GROUP * (k // 32)}, align 32")
        corr, inter = None, None
        if quads:  # rows as lanes: the interleaved activations and their offset terms
            groups = -(-tile // GROUP)
            xcorr = None
            if _row_offset(layout, variant):
                xcorr = fn.v(f"alloca i32, i64 {groups * (k // 32) * GROUP}, align 32")
            inter = (fn.v(f"alloca i8, i64 {groups * k * GROUP}, align 32"), xcorr)
        elif _row_offset(layout, variant):
            corr = fn.v(f"alloca i32, i64 {tile * (k // 4)}, align 32")
        first_single = _tiles(fn, layout, variant, k, tile, dxt, st, corr, inter)
        # (a single-row 512-bit path, Q4_K's, beats a small tile: measured)
        for small in () if layout.decode_wide else [t for t in SMALL_TILES if t < tile]:
            first_single = _tiles(fn, layout, variant, k, small, dxt, st, corr, inter, first_single)
    if quads:
        _quads(fn, layout, variant, k, first_single, quad_corr)
    elif layout.decode_pair is not None:
        _pairs(fn, layout, variant, k, first_single, *pair_scratch)
    else:
        fn.loop("%n0", "%n1", [], lambda n, _c: _singles(fn, layout, variant, k, n, first_single) or [])
    fn.do("ret void")
    return module([fn], DECLARATIONS[variant] + FLOAT_DECLARATIONS + LOOKUP_DECLARATIONS[variant]), fn.name
