"""Renders the quantized matmul kernel: y[r, n] = sum_b (weight block b of row n) . (activation row r).

Owns: the loops and the order of summation. One kernel per (weight type, K, variant, row tile, order):

    for each chunk of ~128 KB of weight rows in [n0, n1):        # threads split [n0, n1)
        for each full tile of T activation rows (T > 1):
            Q8_0, Q4_1, Q5_0, Q5_1 on VNNI (T = 8 or 4): matmul_wide_ir's 512-bit tiles, T rows x 4 columns
            Q2_K .. Q6_K on VNNI (T >= 8): first matmul_q{2..6}k_lanes_ir's tiles of 16 rows, then as below
            Q8_0 .. Q5_1 in "block_chain" on VNNI (T >= 8): first matmul_b32_lanes_ir's 16 rows, then as below
            Q3_K, Q5_K, Q6_K, IQ4_XS in "block_chain" on VNNI (T >= 8): first matmul_k_chain_ir's 16 rows
            the others:
            copy the tile's d_x (and s) into a [block][row] scratch, once per tile and chunk
            for n in the chunk:
                for b in blocks of K:       # the weight block is decoded once per tile
    leftover rows (all rows when M < T, e.g. decode), each alone:
        block-32 types: for each leftover row (column chunks of ~128 KB when several rows are left):
            for n, n+1 in column pairs of [n0, n1):     # two weight rows per vector, see column_pairs
                for b in blocks of K: (per row as below)
            "scalar" order (IQ4_NL, MXFP4, Q4_0; Q8_0 .. Q5_1 in "block_chain"): columns n .. n+7 at
            once instead, one <8 x float> chain a row (see column_quads), rows in groups of 4, 3 or
            2 that share each decoded block (no 4-row tile for these types)
        k-quants: for n in [n0, n1), for each leftover row (Q3_K, Q5_K, Q6_K, IQ4_XS in "block_chain":
            two columns at a time, their integer sums reduced together: matmul_k_columns_ir; Q4_K's one row
            alone too, four columns at a time):
            for b in blocks of K:
                per row: isum = sum over the block's chunks of lane_scale * dot8  (exact int32 lanes)
                         isum -= offset * (sum of each 4 activations)             (Q4_0, Q5_0, Q8_0 on VNNI)
                         isum -= pair sums of offsets * xsum16                    (Q6_K)
                "lanes" order (Q4_0 .. Q8_0, Q3_K, Q5_K, Q6_K, IQ4_XS: ggml's vec-dots):
                         acc  = fma(d_w * d_x, float(isum), acc)                  (8 float lanes)
                         accm = accm + m * s_x           (Q4_1/Q5_1)
                         accm = fma(-(dmin * d_x), float(sum_j min_j * bsum_j), accm)   (Q5_K)
                "scalar" order (Q2_K, Q4_K, IQ4_NL, MXFP4: ggml's repacked gemvs; orders.py's
                "block_chain", which Q8_0, Q4_1, Q5_0, Q5_1, Q3_K, Q5_K, Q6_K, IQ4_XS also build
                when `order` asks for it):
                         acc  = fma(float(sum of isum lanes), d_w * d_x, acc)     (one float)
                         accm = fma(float(sum_j min_j * bsum_j), dmin * d_x, accm)      (Q2_K, Q4_K, Q5_K)
                         accm = fma(m_w, s_x, accm)                               (Q4_1, Q5_1)
            lanes:  y[r, n] = ((acc0+acc4) + (acc2+acc6)) + ((acc1+acc5) + (acc3+acc7)) + accm
            scalar: y[r, n] = acc - accm (Q2_K, Q4_K, Q5_K), acc + accm (Q4_1, Q5_1), acc (the others)

These are `kinetic.ir.numerics.matmul`'s float operations in its order (the kernels llama.cpp runs
for a decode row on x86; `order="block_chain"` on the "lanes" types: the reference's block_chain), so
every kernel gives the reference bit for bit. The order is a parameter of the render (`order`, the
layout's `dot_order`); None is the type's ggml order, whose kernels are unchanged by it. Table-coded weights
(IQ4_NL, IQ4_XS, MXFP4) are looked up per block (`vpshufb`), signed ones multiplied through
|w| and x with w's sign where pmaddubsw takes them.
In a tile the per-row float operations run as 8-row vectors (d_w * d_x for 8 rows in one multiply,
Q4_1/Q5_1's m * s and Q4_K's two fmas on 8 rows' accumulators, Q4_K's integer lane sums of 8 rows
reduced together by a transpose-add tree), each lane one row's own operation on the same operands.
Integer sums are exact, so how they are grouped (k-quant scales through pmaddubsw + vpdpwssd, two
accumulator chains; Q4_K alone on VNNI through 512-bit vectors; weights with an offset taken unsigned,
the offset times the activations' sums of 4 precomputed once per row and used as vpdpbusd's starting
value) is free.
Decode (a row alone) of block-32 types runs two adjacent weight rows at once (`column_pairs`): one
fma chain per row is latency-bound at 4 cycles per block, two rows' chains in one vector are not (eight
for the scalar order, `column_quads`, whose tiles keep rows in lanes instead: `_interleave`).
A row's float operations are the same sequence whatever T, M, [n0, n1) or the variant, so results
are bit-identical across batch sizes, tilings, thread counts and variants. The reduction dimension is
never split.

Modules: this one (the kernel's parameters and the choice of loops), matmul_block_ir (one block against
one row: decoding, the integer dot, the minimum terms), matmul_rows_ir (rows alone, K-quants),
matmul_tiles_ir (tiles of T rows), matmul_wide_ir (512-bit tiles of T rows x 4 columns of the block-32
lanes types on VNNI: the same per-lane operations, two columns per vector), matmul_q{2..6}k_lanes_ir
(Q2_K .. Q6_K on VNNI: 16 rows as the lanes of 512-bit vectors; their shared loops in
matmul_k_lanes_ir), matmul_b32_lanes_ir (Q8_0 .. Q5_1 in "block_chain" on VNNI, 16 rows as lanes on
those loops), matmul_k_chain_ir (Q3_K, Q5_K, Q6_K, IQ4_XS in "block_chain", likewise; their rows alone in
matmul_k_columns_ir),
matmul_columns_ir (rows alone of block-32 types eight columns at a time), matmul_pairs_ir (two at a
time); the block layouts are quant_blocks'.
"""

from __future__ import annotations

from dataclasses import replace

from kinetic.codegen.cpu import matmul_b32_lanes_ir as b32_ir
from kinetic.codegen.cpu import matmul_k_chain_ir as k_chain_ir
from kinetic.codegen.cpu import matmul_k_columns_ir as k_columns_ir
from kinetic.codegen.cpu import matmul_k_lanes_ir as lanes_ir
from kinetic.codegen.cpu import matmul_q2k_lanes_ir as q2k_ir
from kinetic.codegen.cpu import matmul_q3k_lanes_ir as q3k_ir
from kinetic.codegen.cpu import matmul_q4k_lanes_ir as q4k_ir
from kinetic.codegen.cpu import matmul_q5k_lanes_ir as q5k_ir
from kinetic.codegen.cpu import matmul_q6k_lanes_ir as q6k_ir
from kinetic.codegen.cpu import matmul_wide_ir as wide_ir
from kinetic.codegen.cpu.llvm_ir import Function, module
from kinetic.codegen.cpu.matmul_block_ir import row_offset
from kinetic.codegen.cpu.matmul_columns_ir import QUAD_GROUPS, column_quads, quad_declarations
from kinetic.codegen.cpu.matmul_pairs_ir import column_pairs, pair_scratch
from kinetic.codegen.cpu.matmul_rows_ir import single_rows
from kinetic.codegen.cpu.matmul_tiles_ir import GROUP, row_tiles
from kinetic.codegen.cpu.quant_blocks import LAYOUTS, Layout
from kinetic.codegen.cpu.target import DECLARATIONS, kernel_orders

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


# 16 rows in lanes, VNNI: K-quants, and the block-32 types in the "block_chain" order
LANE_TILES = (q2k_ir.TILES, q3k_ir.TILES, q4k_ir.TILES, q5k_ir.TILES, q6k_ir.TILES, *b32_ir.TILES, *k_chain_ir.TILES)
# leftover rows below a tile (a verification pass's few rows, a Convoy pass of a few users' decode rows)
# share each decoded block in tiles of these; fewer rows go alone (the "scalar" order's column quads
# instead share it in row groups, matmul_columns_ir.QUAD_GROUPS, faster than this tile). Not 2: two or three rows alone cost
# less than in a 2-row tile (2 threads, one-row-a-sequence passes, median ms a pass: SmolLM2 Q4_1 2 rows
# 15.4 vs 20.8, 3 rows 21.2 vs 26.1; Gemma 3 2 rows 24-31 vs 37-39, 3 rows 26-37 vs 53-58; 4 rows in a
# 4-row tile no slower than alone)
SMALL_TILES = (4,)


# kinetic/ir/orders.py's names of the quantized orders -> the float order the kernels build
BUILT_ORDERS = {"lanes8": "lanes", "block_chain": "scalar"}


def ordered_layout(wtype, order: str | None = None) -> Layout:
    """The layout of `wtype` building `order` (orders.py's name; None or "": the type's ggml order);
    ValueError where the type's kernels do not follow it (target.kernel_orders)."""
    layout = LAYOUTS[wtype]
    if not order or BUILT_ORDERS.get(order) == layout.float_order:
        return layout
    if order not in BUILT_ORDERS or order not in kernel_orders(layout.wtype):
        raise ValueError(f"no {layout.wtype.name} matmul kernel follows the order {order!r}")
    return replace(layout, dot_order=BUILT_ORDERS[order])


def kernel_name(layout: Layout, k: int, variant: str, tile: int, wide: bool = False) -> str:
    chain = "_chain" if layout.dot_order is not None else ""  # an order other than the type's ggml order
    return f"kin_mm_{layout.wtype.name.lower()}_k{k}_{variant}_t{tile}{'w' if wide else ''}{chain}"


def render_matmul(wtype, k: int, variant: str, tile: int, *, wide: bool = True,
                  order: str | None = None) -> tuple[str, str]:
    """(module IR text, function name) for one specialized kernel. `wide`: full tiles of the types
    matmul_wide_ir serves run there (R = tile rows by four columns, 512-bit), Q2_K's .. Q6_K's tiles
    of 16 rows in matmul_q{2..6}k_lanes_ir (and Q8_0's .. Q5_1's in the "block_chain" order in
    matmul_b32_lanes_ir); False keeps them on matmul_tiles_ir (the same bits; for comparisons).
    `order`: the reduction order (kinetic/ir/orders.py's name), None for the type's ggml order."""
    layout = ordered_layout(wtype, order)
    if k % layout.block:
        raise ValueError(f"{wtype.name} needs K a multiple of {layout.block}, got {k}")
    lanes16 = next((t for t in LANE_TILES if wide and t.applies(layout, variant, tile, k)), None)
    wide32 = wide and wide_ir.applies(layout, variant, tile, k)
    fn = Function(kernel_name(layout, k, variant, tile, lanes16 is not None or wide32), PARAMS)
    wide_space = wide_ir.wide_scratch(fn, layout, variant, k, tile) if wide32 else None
    lanes_space = lanes16.scratch(fn, k) if lanes16 is not None else None
    quads = layout.decode_pair is not None and layout.float_order == "scalar"
    pair_space = pair_scratch(fn, layout, variant, k) if layout.decode_pair is not None and not quads else None
    quad_corr = None
    if quads and row_offset(layout, variant):  # a group's rows' offset terms
        quad_corr = fn.v(f"alloca i32, i64 {max(QUAD_GROUPS, default=1) * k // 8}, align 16")
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
            if row_offset(layout, variant):
                xcorr = fn.v(f"alloca i32, i64 {groups * (k // 32) * GROUP}, align 32")
            inter = (fn.v(f"alloca i8, i64 {groups * k * GROUP}, align 32"), xcorr)
        elif row_offset(layout, variant):
            corr = fn.v(f"alloca i32, i64 {tile * (k // 4)}, align 32")
        if lanes16 is not None:  # 16-row tiles first, then the usual tile for the rows left
            first_single = lanes16.tiles(fn, k, lanes_space, "0")
        if wide_space is not None:
            first_single = wide_ir.wide_tiles(fn, layout, variant, k, wide_space)
        else:
            first_single = row_tiles(fn, layout, variant, k, tile, dxt, st, corr, inter, first_single)
        # (a single-row 512-bit path, Q4_K's, beats a small tile, and so do the quads' row groups: measured)
        for small in () if layout.decode_wide or (quads and QUAD_GROUPS) else [t for t in SMALL_TILES if t < tile]:
            first_single = row_tiles(fn, layout, variant, k, small, dxt, st, corr, inter, first_single)

    def rows_alone() -> None:
        fn.loop("%n0", "%n1", [], lambda n, _c: single_rows(fn, layout, variant, k, n, first_single) or [])

    if quads:
        column_quads(fn, layout, variant, k, first_single, quad_corr)
    elif layout.decode_pair is not None:
        column_pairs(fn, layout, variant, k, first_single, *pair_space)
    elif k_columns_ir.applies(layout):
        k_columns_ir.chain_columns(fn, layout, variant, k, first_single, rows_alone)
    else:
        rows_alone()
    fn.do("ret void")
    declarations = DECLARATIONS[variant] + FLOAT_DECLARATIONS + LOOKUP_DECLARATIONS[variant]
    declarations += (wide_ir.DECLARATIONS if wide32 else []) + (lanes_ir.DECLARATIONS if lanes16 is not None else [])
    declarations += quad_declarations(layout, variant) if quads else []
    return module([fn], declarations), fn.name
