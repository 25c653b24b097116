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
        k-quants: for n in [n0, n1), for each leftover row:
            for b in blocks of K:
                per row: isum = sum over the block's chunks of lane_scale * dot8  (exact int32 lanes)
                         isum -= offset * (sum of each 4 activations)             (Q4_0, Q5_0, Q8_0 on VNNI)
                         isum -= pair sums of offsets * xsum16                    (Q6_K)
                "lanes" order (block-32 types, Q5_K, Q6_K):
                         acc  = fma(d_w * d_x, float(isum), acc)                  (8 float lanes)
                         accm = accm + m * s_x           (Q4_1/Q5_1)
                         accm = accm - dmin * d_x * sum_j min_j * bsum_j          (Q5_K)
                "scalar" order (Q4_K, ggml_gemv_q4_K_8x8_q8_K):
                         acc  = fma(float(sum of isum lanes), d_w * d_x, acc)     (one float)
                         accm = fma(float(sum_j min_j * bsum_j), dmin * d_x, accm)
            lanes:  y[r, n] = ((acc0+acc4) + (acc2+acc6)) + ((acc1+acc5) + (acc3+acc7)) + accm
            scalar: y[r, n] = acc - accm

These are `kinetic.ir.numerics.matmul`'s float operations in its order (ggml's single-row kernels)
for the block-32 types, Q4_K and Q6_K, so those kernels give the reference bit for bit; Q5_K's
reference is still a float32 product of dequantized values, so it differs by rounding.
In a tile the per-row float operations run as 8-row vectors (d_w * d_x for 8 rows in one multiply,
Q4_1/Q5_1's m * s and Q4_K's two fmas on 8 rows' accumulators, Q4_K's integer lane sums of 8 rows
reduced together by a transpose-add tree), each lane one row's own operation on the same operands.
Integer sums are exact, so how they are grouped (k-quant scales through pmaddubsw + vpdpwssd, two
accumulator chains; Q4_K alone on VNNI through 512-bit vectors; weights with an offset taken unsigned,
the offset times the activations' sums of 4 precomputed once per row and used as vpdpbusd's starting
value) is free.
Decode (a row alone) of block-32 types runs two adjacent weight rows at once (`_pairs`): one fma
chain per row is latency-bound at 4 cycles per block, two rows' chains in one vector are not.
A row's float operations are the same sequence whatever T, M, [n0, n1) or the variant, so results
are bit-identical across batch sizes, tilings, thread counts and variants. The reduction dimension is
never split.
"""

from __future__ import annotations

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
]

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
            chains[c % CHAINS] = dot8_scaled(fn, variant, chains[c % CHAINS], chunk.w, x, chunk.scale16)
            if c == len(blk.chunks) - 1:
                total = chains[0]
                for other in chains[1 : len(blk.chunks)]:
                    total = fn.v(f"add <8 x i32> {total}, {other}")
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
    scale = fn.v(f"fmul float {blk.min_scale}, {dx}")
    term = fn.v(f"fmul float {scale}, {fn.v(f'sitofp i32 {_min_dot(fn, blk, row, b)} to float')}")
    return fn.v(f"fsub float {accm}, {term}")


def _fma(fn: Function, a: str, b: str, c: str) -> str:
    return fn.v(f"call float @llvm.fma.f32(float {a}, float {b}, float {c})")


def _accumulate_scalar(fn: Function, blk: Block, row: _Rows, b: str, isum: str, dx: str, acc: str, accm: str):
    """Q4_K as ggml_gemv_q4_K_8x8_q8_K: acc = fma(float(iacc), d_w*d_x, acc),
    accm = fma(float(imin), dmin*d_x, accm), with iacc and imin exact int32 per super-block."""
    iacc = fn.v(f"call i32 @llvm.vector.reduce.add.v8i32(<8 x i32> {isum})")
    acc = _fma(fn, fn.v(f"sitofp i32 {iacc} to float"), fn.v(f"fmul float {blk.d}, {dx}"), acc)
    imin = fn.v(f"sitofp i32 {_min_dot(fn, blk, row, b)} to float")
    accm = _fma(fn, imin, fn.v(f"fmul float {blk.min_scale}, {dx}"), accm)
    return acc, accm


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
    t8 = _fold16(fn, t16)
    lo = fn.v(f"shufflevector <8 x i32> {t8}, <8 x i32> {m8}, {const_vec('i32', [0, 1, 2, 3, 8, 9, 10, 11])}")
    hi = fn.v(f"shufflevector <8 x i32> {t8}, <8 x i32> {m8}, {const_vec('i32', [4, 5, 6, 7, 12, 13, 14, 15])}")
    v = fn.v(f"add <8 x i32> {lo}, {hi}")  # [iacc partials x4 | imin partials x4]
    for swap in ([2, 3, 0, 1, 6, 7, 4, 5], [1, 0, 3, 2, 5, 4, 7, 6]):
        mask = const_vec("i32", swap)
        v = fn.v(f"add <8 x i32> {v}, {fn.v(f'shufflevector <8 x i32> {v}, <8 x i32> poison, {mask}')}")
    both = fn.v(f"shufflevector <8 x i32> {v}, <8 x i32> poison, {const_vec('i32', [0, 4])}")
    ints = fn.v(f"sitofp <2 x i32> {both} to <2 x float>")
    dmin = fn.v(f"fpext <2 x half> {fn.load('<2 x half>', blk_ptr)} to <2 x float>")
    dx = fn.load("float", fn.gep(row.xd, b, "float"), 4)
    scale = fn.v(f"fmul <2 x float> {dmin}, {fn.splat_value(2, 'float', dx)}")
    return fn.v(f"call <2 x float> @llvm.fma.v2f32(<2 x float> {ints}, <2 x float> {scale}, <2 x float> {acc})")


def _accumulate(fn: Function, layout: Layout, variant: str, rows: list[_Rows], wrow: str, b: str, accs: list[str]):
    blk = layout.decode(fn, fn.gep(wrow, fn.v(f"mul i64 {b}, {layout.block_bytes}")))
    new_acc, new_min = [], []
    for i, row in enumerate(rows):
        isum = _block_dot(fn, variant, blk, row, b, layout.block)
        dx = fn.load("float", fn.gep(row.xd, b, "float"), 4)
        if layout.float_order == "scalar":
            acc, accm = _accumulate_scalar(fn, blk, row, b, isum, dx, accs[i], accs[len(rows) + i])
            new_acc.append(acc)
            new_min.append(accm)
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
    if wide:
        carried = [("<2 x float>", "zeroinitializer")]

    def step(b: str, accs: list[str]) -> list[str]:
        if wide:
            return [_accumulate_wide(fn, layout, rows[0], wrow, b, accs[0])]
        return _accumulate(fn, layout, variant, rows, wrow, b, accs)

    finals = fn.loop(0, k // layout.block, carried, step)
    if wide:
        finals = [fn.v(f"extractelement <2 x float> {finals[0]}, i64 {i}") for i in range(2)]
    for i, row in enumerate(rows):
        if scalar:
            y = fn.v(f"fsub float {finals[i]}, {finals[tile + i]}")
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
    blk = layout.decode(fn, fn.gep(wrow, fn.v(f"mul i64 {b}, {layout.block_bytes}")))
    isums = [_block_dot(fn, variant, blk, row, b, layout.block) for row in rows]
    base = fn.v(f"mul i64 {b}, {GROUP * groups}")

    def group_vec(src: str, g: str) -> str:
        return fn.load("<8 x float>", fn.gep(src, fn.v(f"add i64 {base}, {GROUP * g}"), "float"), 32)

    dxv = [group_vec(dxt, g) for g in range(groups)]
    if layout.float_order == "scalar":
        iacc = _transpose_sum(fn, isums)
        imin = _transpose_sum(fn, [_min_lanes(fn, blk, row, b) for row in rows])
        d8 = fn.splat_value(8, "float", blk.d)
        m8 = fn.splat_value(8, "float", blk.min_scale)
        acc, accm = [], []
        for g in range(groups):
            fa = fn.v(f"sitofp <8 x i32> {iacc[g]} to <8 x float>")
            acc.append(_fma8(fn, fa, fn.v(f"fmul <8 x float> {d8}, {dxv[g]}"), accs[g]))
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
                scale = fn.v(f"fmul <8 x float> {m8}, {dxv[g]}")
                term = fn.v(f"fmul <8 x float> {scale}, {fn.v(f'sitofp <8 x i32> {imin} to <8 x float>')}")
                new.append(fn.v(f"fsub <8 x float> {accm}, {term}"))
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


def _tiles(fn: Function, layout: Layout, variant: str, k: int, tile: int, dxt: str, st: str | None,
           corr: str | None) -> str:
    """All full tiles of `tile` rows over [n0, n1), in column chunks; returns the first leftover row."""
    nb = k // layout.block
    row_bytes = nb * layout.block_bytes
    groups = -(-tile // GROUP)
    chunk = max(1, CHUNK_BYTES // row_bytes)
    tiles = fn.v(f"udiv i64 %m, {tile}")
    scalar = layout.float_order == "scalar"

    def chunk_body(c0: str, _c: list[str]) -> list[str]:
        end = fn.v(f"add i64 {c0}, {chunk}")
        c1 = fn.v(f"select i1 {fn.v(f'icmp slt i64 {end}, %n1')}, i64 {end}, i64 %n1")

        def tile_body(tt: str, _c2: list[str]) -> list[str]:
            first = fn.v(f"mul i64 {tt}, {tile}")
            _transpose_scales(fn, "%xd", nb, first, tile, groups, dxt)
            if layout.activation == "q8_1":
                _transpose_scales(fn, "%xe", k // 32, first, tile, groups, st)
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
                    return _tile_block(fn, layout, variant, rows, groups, wrow, b, dxt, st, accs)

                finals = fn.loop(0, nb, carried, step)
                for i, row in enumerate(rows):
                    g, lane = divmod(i, GROUP)
                    if scalar:
                        a = fn.v(f"extractelement <8 x float> {finals[g]}, i64 {lane}")
                        mm = fn.v(f"extractelement <8 x float> {finals[groups + g]}, i64 {lane}")
                        y = fn.v(f"fsub float {a}, {mm}")
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
        return []

    fn.loop("%n0", "%n1", [], chunk_body, step=chunk)
    return fn.v(f"mul i64 {tiles}, {tile}")


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

    def chunk(c0: str, _c: list[str]) -> list[str]:
        end = fn.v(f"add i64 {c0}, {step}")
        c1 = fn.v(f"select i1 {fn.v(f'icmp slt i64 {end}, %n1')}, i64 {end}, i64 %n1")

        def row(r: str, _c2: list[str]) -> list[str]:
            fill_scales(r)
            if offset:
                _fill_corrections(fn, layout, variant, k, r, corr)
            xrow = fn.gep("%xq", fn.v(f"mul i64 {r}, {k}"))
            orow = fn.gep("%out", fn.v(f"mul i64 {r}, %ldo"), "float")
            fn.loop(c0, c1, [], lambda p, _c3: pair(xrow, orow, p, c1) or [], step=2)
            return []

        fn.loop(first_row, "%m", [], row)
        return []

    fn.loop("%n0", "%n1", [], chunk, step=step)


def render_matmul(wtype, k: int, variant: str, tile: int) -> tuple[str, str]:
    """(module IR text, function name) for one specialized kernel."""
    layout = LAYOUTS[wtype]
    if k % layout.block:
        raise ValueError(f"{wtype.name} needs K a multiple of {layout.block}, got {k}")
    fn = Function(kernel_name(layout, k, variant, tile), PARAMS)
    pair_scratch = _pair_scratch(fn, layout, variant, k) if layout.decode_pair is not None else None
    first_single = "0"
    if tile > 1:
        size = -(-tile // GROUP) * GROUP * (k // layout.block)
        dxt = fn.v(f"alloca float, i64 {size}, align 32")
        st = None
        if layout.activation == "q8_1":
            st = fn.v(f"alloca float, i64 {-(-tile // GROUP) * GROUP * (k // 32)}, align 32")
        corr = None
        if _row_offset(layout, variant):
            corr = fn.v(f"alloca i32, i64 {tile * (k // 4)}, align 32")
        first_single = _tiles(fn, layout, variant, k, tile, dxt, st, corr)
    if layout.decode_pair is not None:
        _pairs(fn, layout, variant, k, first_single, *pair_scratch)
    else:
        fn.loop("%n0", "%n1", [], lambda n, _c: _singles(fn, layout, variant, k, n, first_single) or [])
    fn.do("ret void")
    return module([fn], DECLARATIONS[variant] + FLOAT_DECLARATIONS), fn.name
