"""Block decoders of ggml's classic formats: Q8_0, Q4_1, Q5_0, Q5_1 and the K-quants Q4_K, Q5_K, Q6_K.

Owns: how one block's bytes become `Block` chunks of small integers with their scales (and Q4_K's
512-bit `WideBlock`), how two weight rows' block-32 blocks become one `PairBlock`, and the byte
helpers the other decoders (blocks_newer.py) share. Layout facts are ggml's (block_q4_1 = {f16 d,
f16 m, u8 qs[16]}, ..., ggml-common.h), read from its headers and from `gguf.quants`' dequantizers;
no code is copied. No loops, no accumulation order: that is matmul_ir's.
"""

from __future__ import annotations

from collections.abc import Callable

from kinetic.codegen.cpu.block_types import Block, Chunk, PairBlock, WideBlock
from kinetic.codegen.cpu.llvm_ir import Function, const_vec, splat

CONCAT_16 = const_vec("i32", range(32))


def nibbles(fn: Function, ptr: str, n: int = 16) -> tuple[str, str]:
    """Low and high nibbles of n bytes at ptr, each <n x i8>."""
    raw = fn.load(f"<{n} x i8>", ptr)
    lo = fn.v(f"and <{n} x i8> {raw}, {splat('i8', 15)}")
    hi = fn.v(f"lshr <{n} x i8> {raw}, {splat('i8', 4)}")
    return lo, hi


def legacy_quants(fn: Function, qs: str) -> str:
    """Q4_0/Q4_1/Q5 nibble layout: element j < 16 is qs[j] & 15, element j + 16 is qs[j] >> 4."""
    lo, hi = nibbles(fn, qs)
    return fn.v(f"shufflevector <16 x i8> {lo}, <16 x i8> {hi}, {CONCAT_16}")


def _with_high_bits(fn: Function, w: str, qh_ptr: str) -> str:
    """Add bit j of the little-endian u32 at qh_ptr as bit 4 of element j."""
    qh = fn.load("i32", qh_ptr)
    bits = fn.v(f"bitcast i32 {qh} to <32 x i1>")
    wide = fn.v(f"zext <32 x i1> {bits} to <32 x i8>")
    high = fn.v(f"shl <32 x i8> {wide}, {splat('i8', 4)}")
    return fn.v(f"or <32 x i8> {w}, {high}")


def f16s(fn: Function, ptr: str, n: int) -> list[str]:
    """n <= 4 consecutive f16 at ptr widened to float, read as one <4 x half> (one `vcvtph2ps` from
    memory instead of an insert and a convert each); the block must hold 8 bytes from ptr."""
    v = fn.v(f"fpext <4 x half> {fn.load('<4 x half>', ptr)} to <4 x float>")
    return [fn.v(f"extractelement <4 x float> {v}, i64 {i}") for i in range(n)]


def decode_q8_0(fn: Function, blk: str) -> Block:
    w = fn.load("<32 x i8>", fn.gep(blk, 2))
    return Block([Chunk(w, True)], f16s(fn, blk, 1)[0])


def decode_q4_1(fn: Function, blk: str) -> Block:
    w = legacy_quants(fn, fn.gep(blk, 4))
    d, m = f16s(fn, blk, 2)
    return Block([Chunk(w, False)], d, min_scale=m)


def decode_q5_0(fn: Function, blk: str) -> Block:  # unsigned 0..31, Layout.offset 16
    w = _with_high_bits(fn, legacy_quants(fn, fn.gep(blk, 6)), fn.gep(blk, 2))
    return Block([Chunk(w, False)], f16s(fn, blk, 1)[0])


def decode_q5_1(fn: Function, blk: str) -> Block:
    w = _with_high_bits(fn, legacy_quants(fn, fn.gep(blk, 8)), fn.gep(blk, 4))
    d, m = f16s(fn, blk, 2)
    return Block([Chunk(w, False)], d, min_scale=m)


def bare(typed: str) -> str:
    """A constant vector without its leading type, as a binary operator's second operand takes it."""
    return typed.split("> ", 1)[1]


def _k4_scales(fn: Function, base: str) -> str:
    """Q4_K/Q5_K's 12 bytes -> <16 x i8>: the 8 six-bit scales, then the 8 six-bit mins (ggml's packing:
    j < 4: scale q[j] & 63, min q[j+4] & 63; j >= 4: scale (q[j+4] & 15) | (q[j-4] >> 6) << 4,
    min (q[j+4] >> 4) | (q[j] >> 6) << 4), as a few byte-vector operations."""
    raw = fn.load("<12 x i8>", base)
    q = fn.v(f"shufflevector <12 x i8> {raw}, <12 x i8> poison, {const_vec('i32', list(range(12)) + [0] * 4)}")
    pick = const_vec("i32", [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11])
    low = fn.v(f"shufflevector <16 x i8> {q}, <16 x i8> poison, {pick}")
    keep = fn.v(f"and <16 x i8> {low}, {bare(const_vec('i8', [63] * 4 + [15] * 4 + [63] * 4 + [0] * 4))}")
    shifted = fn.v(f"lshr <16 x i8> {low}, {splat('i8', 4)}")
    top4 = fn.v(f"and <16 x i8> {shifted}, {bare(const_vec('i8', [0] * 12 + [15] * 4))}")
    pick = const_vec("i32", [16] * 4 + [0, 1, 2, 3] + [16] * 4 + [4, 5, 6, 7])  # 16: a zero byte
    high = fn.v(f"shufflevector <16 x i8> {q}, <16 x i8> zeroinitializer, {pick}")
    top2 = fn.v(f"lshr <16 x i8> {high}, {splat('i8', 2)}")
    bits = fn.v(f"and <16 x i8> {top2}, {splat('i8', 48)}")
    return fn.v(f"or <16 x i8> {fn.v(f'or <16 x i8> {keep}, {top4}')}, {bits}")


def _k4_unpacked(fn: Function, base: str) -> tuple[str, str, list[str], list[str]]:
    """(scales and mins as <16 x i32>, as <16 x i16>, chunk c's <8 x i32> lane scale, its <16 x i16>)."""
    sm = _k4_scales(fn, base)
    s32 = fn.v(f"zext <16 x i8> {sm} to <16 x i32>")
    s16 = fn.v(f"zext <16 x i8> {sm} to <16 x i16>")
    lanes = [fn.v(f"shufflevector <16 x i32> {s32}, <16 x i32> poison, {const_vec('i32', [c] * 8)}") for c in range(8)]
    pairs = [fn.v(f"shufflevector <16 x i16> {s16}, <16 x i16> poison, {const_vec('i32', [c] * 16)}") for c in range(8)]
    return s32, s16, lanes, pairs


def _k4_mins16(fn: Function, s32: str) -> str:
    """<16 x i32> with min j at positions 2j and 2j+1 (one per 16 activations)."""
    pick = const_vec("i32", [8 + j // 2 for j in range(16)])
    return fn.v(f"shufflevector <16 x i32> {s32}, <16 x i32> poison, {pick}")


def decode_q4_k(fn: Function, blk: str) -> Block:
    s32, _s16, lanes, pairs = _k4_unpacked(fn, fn.gep(blk, 4))
    chunks = []
    for pair in range(4):  # 64 elements: low nibbles of 32 bytes, then their high nibbles
        lo, hi = nibbles(fn, fn.gep(blk, 16 + 32 * pair), 32)
        c = 2 * pair
        chunks += [Chunk(lo, False, lanes[c], pairs[c]), Chunk(hi, False, lanes[c + 1], pairs[c + 1])]
    d, dmin = f16s(fn, blk, 2)
    return Block(chunks, d, dmin, _k4_mins16(fn, s32))


def decode_q4_k_wide(fn: Function, blk: str) -> WideBlock:
    sm = _k4_scales(fn, fn.gep(blk, 4))
    s16 = fn.v(f"zext <16 x i8> {sm} to <16 x i16>")
    # the 8 scales as words in each 128-bit lane, then per pair one in-lane byte shuffle (vpshufb, as
    # ggml's AVX2 kernel does): cross-lane word shuffles cost twice as much on 512-bit vectors
    s8 = fn.v(f"shufflevector <16 x i16> {s16}, <16 x i16> poison, {const_vec('i32', list(range(8)) * 4)}")
    lanes = fn.v(f"bitcast <32 x i16> {s8} to <64 x i8>")
    scales = []
    for p in range(4):
        ctrl = [byte for lane in range(4) for byte in [2 * (2 * p + lane // 2), 2 * (2 * p + lane // 2) + 1] * 8]
        sh = fn.v(f"call <64 x i8> @llvm.x86.avx512.pshuf.b.512(<64 x i8> {lanes}, {const_vec('i8', ctrl)})")
        scales.append(fn.v(f"bitcast <64 x i8> {sh} to <32 x i16>"))
    pick = const_vec("i32", [8 + j // 2 for j in range(16)])
    mins = fn.v(f"shufflevector <16 x i16> {s16}, <16 x i16> poison, {pick}")
    shifts = const_vec("i16", [0] * 16 + [4] * 16)
    quants = []
    for p in range(4):  # [q & 15 | q >> 4] of the same 32 bytes: a broadcast, one variable word shift, one and
        raw = fn.load("<32 x i8>", fn.gep(blk, 16 + 32 * p))
        both = fn.v(f"shufflevector <32 x i8> {raw}, <32 x i8> poison, {const_vec('i32', list(range(32)) * 2)}")
        words = fn.v(f"lshr <32 x i16> {fn.v(f'bitcast <64 x i8> {both} to <32 x i16>')}, {bare(shifts)}")
        quants.append(fn.v(f"and <64 x i8> {fn.v(f'bitcast <32 x i16> {words} to <64 x i8>')}, {splat('i8', 15)}"))
    return WideBlock(quants, scales, mins)


def _bit_plane(fn: Function, qh: str, shift: int, mask: int) -> str:
    """((qh >> shift) & mask) << 4 on <32 x i8>: high bits moved above a nibble."""
    shifted = fn.v(f"lshr <32 x i8> {qh}, {splat('i8', shift)}")
    masked = fn.v(f"and <32 x i8> {shifted}, {splat('i8', mask)}")
    return fn.v(f"shl <32 x i8> {masked}, {splat('i8', 4)}")


def decode_q5_k(fn: Function, blk: str) -> Block:
    s32, _s16, lanes, pairs = _k4_unpacked(fn, fn.gep(blk, 4))
    qh = fn.load("<32 x i8>", fn.gep(blk, 16))
    chunks = []
    for pair in range(4):  # chunk c = 2*pair (+1): nibble of qs[32*pair + l], bit c of qh[l] as bit 4
        halves = nibbles(fn, fn.gep(blk, 48 + 32 * pair), 32)
        for half, nib in enumerate(halves):
            c = 2 * pair + half
            w = fn.v(f"or <32 x i8> {nib}, {_bit_plane(fn, qh, c, 1)}")
            chunks.append(Chunk(w, False, lanes[c], pairs[c]))
    d, dmin = f16s(fn, blk, 2)
    return Block(chunks, d, dmin, _k4_mins16(fn, s32))


def decode_q6_k(fn: Function, blk: str) -> Block:
    """Unsigned 6-bit quants (0..63) with their int8 scale per 16; the -32 offset is not applied to
    the weights but through the activation sums (`offsets`), as ggml_vec_dot_q6_K_q8_K does, which
    moves it between lanes: the lane sums are ggml's, not only their total."""
    sc8 = fn.load("<16 x i8>", fn.gep(blk, 192))
    sc = fn.v(f"sext <16 x i8> {sc8} to <16 x i32>")
    sc16 = fn.v(f"sext <16 x i8> {sc8} to <16 x i16>")
    chunks = []
    for half in range(2):
        ql = [fn.load("<32 x i8>", fn.gep(blk, 64 * half + 32 * k)) for k in range(2)]
        qh = fn.load("<32 x i8>", fn.gep(blk, 128 + 32 * half))
        for k in range(4):  # elements 128*half + 32k + l: nibble of ql[k % 2][l], bits 2k, 2k+1 of qh[l]
            op, amount = ("and", 15) if k < 2 else ("lshr", 4)
            nib = fn.v(f"{op} <32 x i8> {ql[k % 2]}, {splat('i8', amount)}")
            w = fn.v(f"or <32 x i8> {nib}, {_bit_plane(fn, qh, 2 * k, 3)}")
            c = 4 * half + k
            lane_scale = fn.v(
                f"shufflevector <16 x i32> {sc}, <16 x i32> poison, {const_vec('i32', [2 * c] * 4 + [2 * c + 1] * 4)}"
            )
            scale16 = fn.v(
                f"shufflevector <16 x i16> {sc16}, <16 x i16> poison, {const_vec('i32', [2 * c] * 8 + [2 * c + 1] * 8)}"
            )
            chunks.append(Chunk(w, False, lane_scale, scale16))
    offsets = fn.v(f"shl <16 x i32> {sc}, {splat('i32', 5)}")  # 32 * sc
    return Block(chunks, fn.load_f16(fn.gep(blk, 208)), offsets=offsets)


# ---- two rows' block at once (PairBlock) ---------------------------------------------------------


def _concat16(fn: Function, a: str, c: str) -> str:
    """<32 x i8>: 16 bytes at a, then 16 bytes at c."""
    lo, hi = fn.load("<16 x i8>", a), fn.load("<16 x i8>", c)
    return fn.v(f"shufflevector <16 x i8> {lo}, <16 x i8> {hi}, {CONCAT_16}")


def pair_nibbles(fn: Function, qa: str, qc: str) -> tuple[str, str]:
    """Q4/Q5 nibbles of two rows: byte j of each row holds element j (low) and element j + 16 (high)."""
    raw = _concat16(fn, qa, qc)
    low = fn.v(f"and <32 x i8> {raw}, {splat('i8', 15)}")
    high = fn.v(f"lshr <32 x i8> {raw}, {splat('i8', 4)}")
    return low, high


def _or_bits(fn: Function, w: str, mask: str) -> str:
    """Set bit 4 of byte j of w where bit j of the i32 mask is set."""
    bits = fn.v(f"bitcast i32 {mask} to <32 x i1>")
    set4 = fn.v(f"or <32 x i8> {w}, {splat('i8', 16)}")
    return fn.v(f"select <32 x i1> {bits}, <32 x i8> {set4}, <32 x i8> {w}")


def _pair_high_bits(fn: Function, low: str, high: str, qha: str, qhc: str) -> tuple[str, str]:
    """Q5's bit j of qh is bit 4 of element j: low takes bits 0..15 of a's then c's qh, high bits 16..31."""
    a, c = fn.load("i32", qha), fn.load("i32", qhc)
    mask_low = fn.v(f"or i32 {fn.v(f'and i32 {a}, 65535')}, {fn.v(f'shl i32 {c}, 16')}")
    mask_high = fn.v(f"or i32 {fn.v(f'lshr i32 {a}, 16')}, {fn.v(f'and i32 {c}, -65536')}")
    return _or_bits(fn, low, mask_low), _or_bits(fn, high, mask_high)


def pair_q8_0(fn: Function, a: str, c: str) -> PairBlock:
    low = _concat16(fn, fn.gep(a, 2), fn.gep(c, 2))
    return PairBlock(low, _concat16(fn, fn.gep(a, 18), fn.gep(c, 18)), signed=True)


def pair_q4(qs: int) -> Callable[[Function, str, str], PairBlock]:
    def decode(fn: Function, a: str, c: str) -> PairBlock:
        return PairBlock(*pair_nibbles(fn, fn.gep(a, qs), fn.gep(c, qs)))

    return decode


def pair_q5(qh: int) -> Callable[[Function, str, str], PairBlock]:
    def decode(fn: Function, a: str, c: str) -> PairBlock:
        low, high = pair_nibbles(fn, fn.gep(a, qh + 4), fn.gep(c, qh + 4))
        return PairBlock(*_pair_high_bits(fn, low, high, fn.gep(a, qh), fn.gep(c, qh)))

    return decode


# byte j of the 64 [a's low | c's low | a's high | c's high] takes byte j // 8 of its row's qh:
# elements 0..15 of a row from its qh bytes 0, 1, elements 16..31 from bytes 2, 3 ([a's qh | c's qh])
_Q5_BYTES = [0] * 8 + [1] * 8 + [4] * 8 + [5] * 8 + [2] * 8 + [3] * 8 + [6] * 8 + [7] * 8
_Q5_BITS = [1 << (j % 8) for j in range(64)]


def _pair_high_bits_vector(fn: Function, low: str, high: str, qha: str, qhc: str) -> tuple[str, str]:
    """_pair_high_bits with the masks made in vector registers: both rows' qh as 8 bytes, spread to
    the 64 weights they belong to (one byte shuffle), tested against each weight's bit (one
    `vptestmb`), then bit 4 set where the test holds (a masked byte add); the same bytes out,
    without the scalar shifts and the two mask moves from general registers."""
    both = fn.v(f"insertelement <2 x i32> poison, i32 {fn.load('i32', qha)}, i64 0")
    both = fn.v(f"insertelement <2 x i32> {both}, i32 {fn.load('i32', qhc)}, i64 1")
    spread = fn.v(f"shufflevector <8 x i8> {fn.v(f'bitcast <2 x i32> {both} to <8 x i8>')}, <8 x i8> poison, "
                  f"{const_vec('i32', _Q5_BYTES)}")
    return _spread_bits(fn, low, high, spread)


def _spread_bits(fn: Function, low: str, high: str, spread: str) -> tuple[str, str]:
    """low, high with bit 4 set in each byte whose qh bit is set: `spread` <64 x i8> holds, for byte
    j of [low | high], the qh byte its bit j % 8 is in."""
    bits = fn.v(f"and <64 x i8> {spread}, {bare(const_vec('i8', [b if b < 128 else b - 256 for b in _Q5_BITS]))}")
    set_bits = fn.v(f"icmp ne <64 x i8> {bits}, zeroinitializer")
    halves = []
    for w, lanes in ((low, range(32)), (high, range(32, 64))):
        mask = fn.v(f"shufflevector <64 x i1> {set_bits}, <64 x i1> poison, {const_vec('i32', lanes)}")
        set4 = fn.v(f"add <32 x i8> {w}, {splat('i8', 16)}")  # bit 4 of a nibble is clear: + 16 sets it
        halves.append(fn.v(f"select <32 x i1> {mask}, <32 x i8> {set4}, <32 x i8> {w}"))  # a masked vpaddb
    return halves[0], halves[1]


def pair_q5_0_heads(fn: Function, a: str, c: str) -> PairBlock:
    """Q5_0 as pair_q5_vector(2) does, with each row's first 8 bytes (f16 d, then qh) read once: the
    fifth bits spread from bytes 2..5 of each, and d handed to the kernel as [d_a, d_c] (PairBlock.d),
    so the kernel reads no scale of its own. The same bytes and scales."""
    heads = fn.v(f"insertelement <2 x i64> poison, i64 {fn.load('i64', a, 1)}, i64 0")
    heads = fn.v(f"insertelement <2 x i64> {heads}, i64 {fn.load('i64', c, 1)}, i64 1")
    raw = fn.v(f"bitcast <2 x i64> {heads} to <16 x i8>")
    low, high = pair_nibbles(fn, fn.gep(a, 6), fn.gep(c, 6))
    spread = fn.v(f"shufflevector <16 x i8> {raw}, <16 x i8> poison, "
                  f"{const_vec('i32', [2 + i if i < 4 else 6 + i for i in _Q5_BYTES])}")
    low, high = _spread_bits(fn, low, high, spread)
    words = fn.v(f"bitcast <2 x i64> {heads} to <8 x half>")
    d = fn.v(f"shufflevector <8 x half> {words}, <8 x half> poison, {const_vec('i32', [0, 4])}")
    return PairBlock(low, high, d=fn.v(f"fpext <2 x half> {d} to <2 x float>"))


def pair_q5_vector(qh: int) -> Callable[[Function, str, str], PairBlock]:
    """pair_q5 with the fifth bits spread in vector registers (`_pair_high_bits_vector`): the same
    PairBlock bytes. The block_chain order's quads use it (matmul_columns_ir.column_quads); the ggml
    order's pairs keep pair_q5, whose kernels' IR stays unchanged."""
    def decode(fn: Function, a: str, c: str) -> PairBlock:
        low, high = pair_nibbles(fn, fn.gep(a, qh + 4), fn.gep(c, qh + 4))
        return PairBlock(*_pair_high_bits_vector(fn, low, high, fn.gep(a, qh), fn.gep(c, qh)))

    return decode


# Q5_0 on AVX-512 VBMI: the fifth bits by one `vpmultishiftqb` per half instead of a byte spread, a
# bit test into a mask and masked adds (Zen 4: in-cache decode 1.17x, the same bytes; matmul_columns_ir)
MULTISHIFT_DECLARATION = "declare <32 x i8> @llvm.x86.avx512.pmultishift.qb.256(<32 x i8>, <32 x i8>)"


def pair_q5_0_multishift(fn: Function, a: str, c: str) -> PairBlock:
    """Q5_0 as pair_q5_0_heads decodes it, bit 4 of each weight moved into place by `vpmultishiftqb`:
    byte j of its result is the 8 bits from bit ctrl_j of qword j / 8 of [h_a, h_a, h_c, h_c] (h: a
    row's first 8 bytes, f16 d then qh, so qh's bit e is the head's bit 16 + e), with ctrl_j =
    12 + e(j) putting bit e(j) at bit 4 of byte j (e(j) = j % 16 in `low`, 16 + j % 16 in `high`);
    `and 16` keeps it and an `or` (one `vpternlogq`) sets it on the nibble. d is left to the kernel,
    which converts a group's d from the heads at once (`heads_d`)."""
    heads = fn.v(f"insertelement <2 x i64> poison, i64 {fn.load('i64', a, 1)}, i64 0")
    heads = fn.v(f"insertelement <2 x i64> {heads}, i64 {fn.load('i64', c, 1)}, i64 1")
    spread = fn.v(f"shufflevector <2 x i64> {heads}, <2 x i64> poison, {const_vec('i32', [0, 0, 1, 1])}")
    source = fn.v(f"bitcast <4 x i64> {spread} to <32 x i8>")
    halves = []
    for first, w in zip((0, 16), pair_nibbles(fn, fn.gep(a, 6), fn.gep(c, 6)), strict=True):
        ctrl = const_vec("i8", [12 + first + j % 16 for j in range(32)])
        bits = fn.v(f"call <32 x i8> @llvm.x86.avx512.pmultishift.qb.256({ctrl}, <32 x i8> {source})")
        kept = fn.v(f"and <32 x i8> {bits}, {splat('i8', 16)}")
        halves.append(fn.v(f"or <32 x i8> {w}, {kept}"))
    return PairBlock(halves[0], halves[1], heads=heads)


def heads_d(fn: Function, heads: list[str], columns: list[int]) -> str:
    """<len(columns) x float>: the f16 d at byte 0 of each head (PairBlock.heads, two rows each, in
    order), lane i column columns[i]'s: one word shuffle of the heads and one conversion."""
    width = 2 * len(heads)
    parts, size = list(heads), 2
    while len(parts) > 1:
        ty = f"<{size} x i64>"
        parts = [fn.v(f"shufflevector {ty} {x}, {ty} {y}, {const_vec('i32', range(2 * size))}")
                 for x, y in zip(parts[0::2], parts[1::2], strict=True)]
        size *= 2
    words = fn.v(f"bitcast <{width} x i64> {parts[0]} to <{4 * width} x half>")
    d = fn.v(f"shufflevector <{4 * width} x half> {words}, <{4 * width} x half> poison, "
             f"{const_vec('i32', [4 * col for col in columns])}")
    return fn.v(f"fpext <{len(columns)} x half> {d} to <{len(columns)} x float>")
