"""One weight block against one activation row in the quantized matmul kernels: the pieces every loop
shape (matmul_rows_ir, matmul_tiles_ir, matmul_columns_ir) shares.

Owns: decoding a block with its codebook looked up (`decode_block`), the exact int32 lane sums of one
block against one row (`block_dot`, with the offset corrections and Q6_K's -32 through the Q8_K sums),
the minimum terms, the per-row activation pointers (`Rows`), the horizontal sums and small vector
helpers, and the column chunks of ~CHUNK_BYTES that every loop walks. The float order each loop
builds from them is described in matmul_ir.py.
"""

from __future__ import annotations

from dataclasses import replace

from kinetic.codegen.cpu.llvm_ir import Function, const_vec, splat
from kinetic.codegen.cpu.quant_blocks import Block, Layout
from kinetic.codegen.cpu.target import dot8, dot8_acc, dot8_scaled

CHUNK_BYTES = 128 << 10  # weight bytes of one column chunk: a tile loops over them while they sit in L2


def row_offset(layout: Layout, variant: str) -> int:
    """The weight offset the kernel subtracts through activation sums (0: none). Q8_0's is 128 (its
    signed bytes flipped to unsigned) on VNNI only: AVX2's pmaddubsw would saturate on 255 * 127 * 2."""
    return layout.offset if layout.offset < 128 or variant == "vnni" else 0


def fill_corrections(fn: Function, layout: Layout, variant: str, k: int, r: str, dst: str) -> None:
    """dst[b] <- <8 x i32>: -offset * (the sum of each 4 activations of block b of row r), exact."""
    off = row_offset(layout, variant)
    xq = fn.gep("%xq", fn.v(f"mul i64 {r}, {k}"))
    ones = splat("i8", off if off < 128 else off - 256)

    def body(b: str, _c: list[str]) -> list[str]:
        x = fn.load("<32 x i8>", fn.gep(xq, fn.v(f"mul i64 {b}, 32")))
        total = dot8(fn, variant, ones, x, False)
        neg = fn.v(f"sub <8 x i32> zeroinitializer, {total}")
        fn.store("<8 x i32>", neg, fn.gep(dst, fn.v(f"mul i64 {b}, 8"), "i32"), 32)
        return []

    fn.loop(0, k // 32, [], body)


class Rows:
    """Per-row pointers into the quantized activations (and the row's offset corrections, if any)."""

    def __init__(self, fn: Function, r: str, k: int, layout: Layout, corr: str | None = None):
        self.r = r
        self.corr = corr
        self.xq = fn.gep("%xq", fn.v(f"mul i64 {r}, {k}"))
        self.xd = fn.gep("%xd", fn.v(f"mul i64 {r}, {k // layout.block}"), "float")
        extra = {"q8_1": (k // 32, "float"), "q8_k": (k // 16, "i32")}.get(layout.activation)
        self.xe = fn.gep("%xe", fn.v(f"mul i64 {r}, {extra[0]}"), extra[1]) if extra else None


CHAINS = 2


def block_dot(fn: Function, variant: str, blk: Block, row: Rows, b: str, block: int) -> str:
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
        prod = fn.v(f"mul <16 x i32> {blk.offsets}, {sums16(fn, row, b)}")
        even = fn.v(f"shufflevector <16 x i32> {prod}, <16 x i32> poison, {const_vec('i32', range(0, 16, 2))}")
        odd = fn.v(f"shufflevector <16 x i32> {prod}, <16 x i32> poison, {const_vec('i32', range(1, 16, 2))}")
        total = fn.v(f"sub <8 x i32> {total}, {fn.v(f'add <8 x i32> {even}, {odd}')}")
    return total


def sums16(fn: Function, row: Rows, b: str) -> str:
    """<16 x i32>: the Q8_K sums of 16 activations of super-block b."""
    return fn.load("<16 x i32>", fn.gep(row.xe, fn.v(f"mul i64 {b}, 16"), "i32"), 4)


def min_dot(fn: Function, blk: Block, row: Rows, b: str) -> str:
    """i32: sum_j mins[j] * (sum of the activations of sub-block j), exact."""
    prod = fn.v(f"mul <16 x i32> {blk.mins}, {sums16(fn, row, b)}")
    return fn.v(f"call i32 @llvm.vector.reduce.add.v16i32(<16 x i32> {prod})")


def min_term(fn: Function, layout: Layout, blk: Block, row: Rows, b: str, dx: str, accm: str) -> str:
    if layout.activation == "q8_1":  # + m * s
        s = fn.load("float", fn.gep(row.xe, b, "float"), 4)
        return fn.v(f"fadd float {accm}, {fn.v(f'fmul float {blk.min_scale}, {s}')}")
    # ggml_vec_dot_q5_K_q8_K: summs += (-d_x * dmin) * isum, contracted to one fma by GCC
    neg = fn.v(f"fneg float {fn.v(f'fmul float {blk.min_scale}, {dx}')}")
    return fma(fn, neg, fn.v(f"sitofp i32 {min_dot(fn, blk, row, b)} to float"), accm)


def fma(fn: Function, a: str, b: str, c: str) -> str:
    return fn.v(f"call float @llvm.fma.f32(float {a}, float {b}, float {c})")


def fma8(fn: Function, a: str, b: str, c: str) -> str:
    return fn.v(f"call <8 x float> @llvm.fma.v8f32(<8 x float> {a}, <8 x float> {b}, <8 x float> {c})")


def reduce_pair(fn: Function, a: str, c: str) -> str:
    """<2 x i32> [sum of a's 8 lanes, sum of c's 8 lanes] (exact)."""
    lo = fn.v(f"shufflevector <8 x i32> {a}, <8 x i32> {c}, {const_vec('i32', [0, 1, 2, 3, 8, 9, 10, 11])}")
    hi = fn.v(f"shufflevector <8 x i32> {a}, <8 x i32> {c}, {const_vec('i32', [4, 5, 6, 7, 12, 13, 14, 15])}")
    v = fn.v(f"add <8 x i32> {lo}, {hi}")
    for swap in ([2, 3, 0, 1, 6, 7, 4, 5], [1, 0, 3, 2, 5, 4, 7, 6]):
        mask = const_vec("i32", swap)
        v = fn.v(f"add <8 x i32> {v}, {fn.v(f'shufflevector <8 x i32> {v}, <8 x i32> poison, {mask}')}")
    return fn.v(f"shufflevector <8 x i32> {v}, <8 x i32> poison, {const_vec('i32', [0, 4])}")


def fold16(fn: Function, v16: str) -> str:
    lo = fn.v(f"shufflevector <16 x i32> {v16}, <16 x i32> poison, {const_vec('i32', range(8))}")
    hi = fn.v(f"shufflevector <16 x i32> {v16}, <16 x i32> poison, {const_vec('i32', range(8, 16))}")
    return fn.v(f"add <8 x i32> {lo}, {hi}")


def hsum(fn: Function, acc: str) -> str:
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


def lookup_codes(fn: Function, variant: str, table: tuple[int, ...], idx: str, offset: int) -> tuple[str, bool]:
    """(weights, signed) of table-coded indices: the table itself (signed), or, when the kernel applies
    the layout's offset through the activation sums, the table plus the offset (unsigned)."""
    if offset:
        return _lookup(fn, variant, [(v + offset) & 255 for v in table], idx), False
    return _lookup(fn, variant, list(table), idx), True


def decode_block(fn: Function, layout: Layout, variant: str, ptr: str) -> Block:
    """The block at ptr with table-coded chunks looked up (once per block, whatever the rows)."""
    blk = layout.decode(fn, ptr)
    offset = row_offset(layout, variant)
    chunks = []
    for chunk in blk.chunks:
        if chunk.table is not None:
            w, signed = lookup_codes(fn, variant, chunk.table, chunk.w, offset)
            chunk = replace(chunk, w=w, signed=signed, table=None)
        chunks.append(chunk)
    return replace(blk, chunks=chunks)


def _sign_split(fn: Function, w: str, x: str) -> tuple[str, str]:
    """(|w|, x with w's sign): the unsigned and signed operands of pmaddubsw with the products w*x."""
    a = fn.v(f"call <32 x i8> @llvm.abs.v32i8(<32 x i8> {w}, i1 false)")
    return a, fn.v(f"call <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8> {x}, <32 x i8> {w})")


def column_chunks(fn: Function, step, body) -> None:
    """body(c0, c1) for each chunk [c0, c1) of `step` columns of [n0, n1): rows loop over a chunk's
    weights while they sit in L2."""

    def chunk(c0: str, _c: list[str]) -> list[str]:
        end = fn.v(f"add i64 {c0}, {step}")
        body(c0, fn.v(f"select i1 {fn.v(f'icmp slt i64 {end}, %n1')}, i64 {end}, i64 %n1"))
        return []

    fn.loop("%n0", "%n1", [], chunk, step=step)
