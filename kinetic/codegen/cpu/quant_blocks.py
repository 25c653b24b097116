"""Weight block layouts (ggml's) decoded into int8 vectors: what one block contributes to a dot.

Owns: for each supported weight type, how one block's bytes become 32-byte chunks of small integers
(signed or unsigned, or 4-bit indices into a 16-value table: IQ4_NL, IQ4_XS, MXFP4) with their
integer scales, the block's float scale, and the term its minimum adds. Layout facts are ggml's
(block_q4_1 = {f16 d, f16 m, u8 qs[16]}, ..., ggml-common.h), read from its headers and from
`gguf.quants`' dequantizers; no code is copied. It owns no loops and no accumulation order: that is
`matmul_ir`'s (and, for the reference, `kinetic/ir/quant_dots.py` reads the same layouts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.llvm_ir import Function, const_vec, splat


@dataclass(frozen=True)
class Chunk:
    """32 weights as <32 x i8> (`signed` tells how to read them) and an optional <8 x i32> lane scale;
    `scale16` is the same scale per 16-bit pair (<16 x i16>, pair 2l and 2l+1 of lane l), for the
    variants that multiply it in with `pmaddwd` / `vpdpwssd` (unused values cost nothing: LLVM drops them)."""

    w: str
    signed: bool
    lane_scale: str | None = None
    scale16: str | None = None
    # w holds 4-bit indices into these 16 signed values (IQ4_NL, IQ4_XS, MXFP4); the kernel looks
    # them up (`vpshufb`, or selects in the generic variant), since how depends on the variant
    table: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Block:
    """A decoded block: chunks in element order, the float scale d, and the minimum's terms.

    `min_scale` is m (Q4_1/Q5_1, multiplied by the activation's s) or dmin (k-quants, multiplied by
    sum_j mins[j] * sum of activations in sub-block j, with `mins` a <16 x i32> per 16 elements).
    `offsets` (Q6_K) is a <16 x i32> per 16 elements: lane l of the integer dot loses
    offsets[2l] * xsum16[2l] + offsets[2l+1] * xsum16[2l+1], ggml's -32 applied through the Q8_K sums.
    """

    chunks: list[Chunk]
    d: str
    min_scale: str | None = None
    mins: str | None = None
    offsets: str | None = None
    # the chunks' scale16 are the scales times 2^scale16_shift (Q3_K: a signed byte in a word's high
    # byte); the kernel shifts the exact lane sums back
    scale16_shift: int = 0


@dataclass(frozen=True)
class PairBlock:
    """Block b of two weight rows a and c, as 32 bytes per half: `low` = [elements 0..15 of a |
    elements 0..15 of c], `high` = [elements 16..31 of a | of c]. Against activations
    [x0..15 | x0..15] and [x16..31 | x16..31] a dot8 gives [a's lanes 0-3 | c's lanes 0-3] and
    [a's lanes 4-7 | c's lanes 4-7]: each row's own exact lane sums, two rows per instruction and no
    shuffle to pair the nibbles. `signed`: Q8_0's bytes (flipped to unsigned by the kernel on VNNI);
    the others are unsigned, their offset subtracted through the activation sums (Layout.offset).
    The float scales (f16 d at byte 0, m at byte 2) are read by the kernel."""

    low: str
    high: str
    signed: bool = False
    table: tuple[int, ...] | None = None  # low/high are indices into these values, as Chunk.table
    d: str | None = None  # <2 x float> [d_a, d_c] where the decoder reads the scales (scalar order)


@dataclass(frozen=True)
class WideBlock:
    """Q4_K's super-block for 512-bit VNNI (one row alone): `quants[p]` = <64 x i8> elements
    64p..64p+63 (chunk 2p, the low nibbles of 32 bytes, then chunk 2p+1, their high nibbles),
    `scales[p]` = <32 x i16> sub-block scale 2p in the first 16 words, 2p+1 in the last 16 (so
    `vpdpwssd` on `pmaddubsw`'s pair sums multiplies each by its scale), `mins` = <16 x i16> min j
    at words 2j and 2j+1 (one per Q8_K sum of 16)."""

    quants: list[str]
    scales: list[str]
    mins: str


@dataclass(frozen=True)
class Layout:
    wtype: Q
    block: int
    block_bytes: int
    activation: str  # "q8_0", "q8_1" or "q8_k"
    decode: Callable[[Function, str], Block]
    has_min: bool = False  # the block's decode sets min_scale (and mins for k-quants)
    # how the float side sums (matmul_ir): "lanes" keeps 8 float lanes per row; "scalar" sums the
    # block's int32 lanes first and keeps one float accumulator (Q2_K, Q4_K, IQ4_NL, MXFP4: ggml's
    # repacked gemvs)
    float_order: str = "lanes"
    # weights stored with an offset (Q4_0 8, Q5_0 16; Q8_0 128 once its signed bytes are flipped to
    # unsigned): the dot takes them unsigned and subtracts offset * (sum of each 4 activations), an
    # exact integer computed once per activation row, instead of sign tricks per weight block
    offset: int = 0
    # block-32 types: two weight rows' block b decoded together (`PairBlock`), for the decode path
    decode_pair: Callable[[Function, str, str], PairBlock] | None = None
    # Q4_K: the super-block as 512-bit vectors (`WideBlock`), for VNNI's single-row path
    decode_wide: Callable[[Function, str], WideBlock] | None = None


CONCAT_16 = const_vec("i32", range(32))


def _nibbles(fn: Function, ptr: str, n: int = 16) -> tuple[str, str]:
    """Low and high nibbles of n bytes at ptr, each <n x i8>."""
    raw = fn.load(f"<{n} x i8>", ptr)
    lo = fn.v(f"and <{n} x i8> {raw}, {splat('i8', 15)}")
    hi = fn.v(f"lshr <{n} x i8> {raw}, {splat('i8', 4)}")
    return lo, hi


def _legacy_quants(fn: Function, qs: str) -> str:
    """Q4_0/Q4_1/Q5 nibble layout: element j < 16 is qs[j] & 15, element j + 16 is qs[j] >> 4."""
    lo, hi = _nibbles(fn, qs)
    return fn.v(f"shufflevector <16 x i8> {lo}, <16 x i8> {hi}, {CONCAT_16}")


def _with_high_bits(fn: Function, w: str, qh_ptr: str) -> str:
    """Add bit j of the little-endian u32 at qh_ptr as bit 4 of element j."""
    qh = fn.load("i32", qh_ptr)
    bits = fn.v(f"bitcast i32 {qh} to <32 x i1>")
    wide = fn.v(f"zext <32 x i1> {bits} to <32 x i8>")
    high = fn.v(f"shl <32 x i8> {wide}, {splat('i8', 4)}")
    return fn.v(f"or <32 x i8> {w}, {high}")


def _f16s(fn: Function, ptr: str, n: int) -> list[str]:
    """n <= 4 consecutive f16 at ptr widened to float, read as one <4 x half> (one `vcvtph2ps` from
    memory instead of an insert and a convert each); the block must hold 8 bytes from ptr."""
    v = fn.v(f"fpext <4 x half> {fn.load('<4 x half>', ptr)} to <4 x float>")
    return [fn.v(f"extractelement <4 x float> {v}, i64 {i}") for i in range(n)]


def _decode_q8_0(fn: Function, blk: str) -> Block:
    w = fn.load("<32 x i8>", fn.gep(blk, 2))
    return Block([Chunk(w, True)], _f16s(fn, blk, 1)[0])


def _decode_q4_1(fn: Function, blk: str) -> Block:
    w = _legacy_quants(fn, fn.gep(blk, 4))
    d, m = _f16s(fn, blk, 2)
    return Block([Chunk(w, False)], d, min_scale=m)


def _decode_q5_0(fn: Function, blk: str) -> Block:  # unsigned 0..31, Layout.offset 16
    w = _with_high_bits(fn, _legacy_quants(fn, fn.gep(blk, 6)), fn.gep(blk, 2))
    return Block([Chunk(w, False)], _f16s(fn, blk, 1)[0])


def _decode_q5_1(fn: Function, blk: str) -> Block:
    w = _with_high_bits(fn, _legacy_quants(fn, fn.gep(blk, 8)), fn.gep(blk, 4))
    d, m = _f16s(fn, blk, 2)
    return Block([Chunk(w, False)], d, min_scale=m)


def _bare(typed: str) -> str:
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
    keep = fn.v(f"and <16 x i8> {low}, {_bare(const_vec('i8', [63] * 4 + [15] * 4 + [63] * 4 + [0] * 4))}")
    shifted = fn.v(f"lshr <16 x i8> {low}, {splat('i8', 4)}")
    top4 = fn.v(f"and <16 x i8> {shifted}, {_bare(const_vec('i8', [0] * 12 + [15] * 4))}")
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


def _decode_q4_k(fn: Function, blk: str) -> Block:
    s32, _s16, lanes, pairs = _k4_unpacked(fn, fn.gep(blk, 4))
    chunks = []
    for pair in range(4):  # 64 elements: low nibbles of 32 bytes, then their high nibbles
        lo, hi = _nibbles(fn, fn.gep(blk, 16 + 32 * pair), 32)
        c = 2 * pair
        chunks += [Chunk(lo, False, lanes[c], pairs[c]), Chunk(hi, False, lanes[c + 1], pairs[c + 1])]
    d, dmin = _f16s(fn, blk, 2)
    return Block(chunks, d, dmin, _k4_mins16(fn, s32))


def _decode_q4_k_wide(fn: Function, blk: str) -> WideBlock:
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
        words = fn.v(f"lshr <32 x i16> {fn.v(f'bitcast <64 x i8> {both} to <32 x i16>')}, {_bare(shifts)}")
        quants.append(fn.v(f"and <64 x i8> {fn.v(f'bitcast <32 x i16> {words} to <64 x i8>')}, {splat('i8', 15)}"))
    return WideBlock(quants, scales, mins)


def _bit_plane(fn: Function, qh: str, shift: int, mask: int) -> str:
    """((qh >> shift) & mask) << 4 on <32 x i8>: high bits moved above a nibble."""
    shifted = fn.v(f"lshr <32 x i8> {qh}, {splat('i8', shift)}")
    masked = fn.v(f"and <32 x i8> {shifted}, {splat('i8', mask)}")
    return fn.v(f"shl <32 x i8> {masked}, {splat('i8', 4)}")


def _decode_q5_k(fn: Function, blk: str) -> Block:
    s32, _s16, lanes, pairs = _k4_unpacked(fn, fn.gep(blk, 4))
    qh = fn.load("<32 x i8>", fn.gep(blk, 16))
    chunks = []
    for pair in range(4):  # chunk c = 2*pair (+1): nibble of qs[32*pair + l], bit c of qh[l] as bit 4
        nibbles = _nibbles(fn, fn.gep(blk, 48 + 32 * pair), 32)
        for half, nib in enumerate(nibbles):
            c = 2 * pair + half
            w = fn.v(f"or <32 x i8> {nib}, {_bit_plane(fn, qh, c, 1)}")
            chunks.append(Chunk(w, False, lanes[c], pairs[c]))
    d, dmin = _f16s(fn, blk, 2)
    return Block(chunks, d, dmin, _k4_mins16(fn, s32))


def _decode_q6_k(fn: Function, blk: str) -> Block:
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


def _pair_nibbles(fn: Function, qa: str, qc: str) -> tuple[str, str]:
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


def _pair_q8_0(fn: Function, a: str, c: str) -> PairBlock:
    low = _concat16(fn, fn.gep(a, 2), fn.gep(c, 2))
    return PairBlock(low, _concat16(fn, fn.gep(a, 18), fn.gep(c, 18)), signed=True)


def _pair_q4(qs: int) -> Callable[[Function, str, str], PairBlock]:
    def decode(fn: Function, a: str, c: str) -> PairBlock:
        return PairBlock(*_pair_nibbles(fn, fn.gep(a, qs), fn.gep(c, qs)))

    return decode


def _pair_q5(qh: int) -> Callable[[Function, str, str], PairBlock]:
    def decode(fn: Function, a: str, c: str) -> PairBlock:
        low, high = _pair_nibbles(fn, fn.gep(a, qh + 4), fn.gep(c, qh + 4))
        return PairBlock(*_pair_high_bits(fn, low, high, fn.gep(a, qh), fn.gep(c, qh)))

    return decode



# ---- Q2_K, Q3_K, IQ4_XS, IQ4_NL, MXFP4 (orders: kinetic/ir/quant_dots.py) ---------------------------

# ggml-common.h kvalues_iq4nl and kvalues_mxfp4 (e2m1 values doubled)
IQ4NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
Q4_0_VALUES = tuple(range(-8, 8))  # Q4_0 runs as IQ4_NL does, its nibble q standing for q - 8


def _op(fn: Function, op: str, ty: str, a: str, b: str) -> str:
    """A binary operation `op ty a, b` (b may be a bare constant vector)."""
    return fn.v(f"{op} {ty} {a}, {b}")


def _lane_scales(fn: Function, sc32: str, c: int) -> str:
    """Chunk c's <8 x i32> lane scales from 16 per-16 scales: sub-block 2c for lanes 0-3, 2c + 1 for 4-7."""
    mask = const_vec("i32", [2 * c] * 4 + [2 * c + 1] * 4)
    return fn.v(f"shufflevector <16 x i32> {sc32}, <16 x i32> poison, {mask}")


def _crumb(fn: Function, qs: str, s: int) -> str:
    """Bits 2s, 2s+1 of each of 32 bytes (Q2_K/Q3_K: value 32s + l of a 128-value half is byte l's)."""
    shifted = fn.v(f"lshr <32 x i8> {qs}, {splat('i8', 2 * s)}") if s else qs
    return fn.v(f"and <32 x i8> {shifted}, {splat('i8', 3)}")


def _byte_words(fn: Function, both: str, c: int, high: bool = False) -> str:
    """<16 x i16> [s[2c] x 8 | s[2c + 1] x 8] zero-extended from `both` = <32 x i8> [s | s] (16 scale
    bytes in each 128-bit half): one in-lane byte shuffle with zeroing (vpshufb) per chunk. `high`:
    the byte in each word's high byte instead, i.e. a signed s times 256 (Block.scale16_shift 8)."""
    pick = [16 * (w // 8) + 2 * c + w // 8 for w in range(16)]
    mask = [b for p in pick for b in ((32, p) if high else (p, 32))]
    words = fn.v(f"shufflevector <32 x i8> {both}, <32 x i8> zeroinitializer, {const_vec('i32', mask)}")
    return fn.v(f"bitcast <32 x i8> {words} to <16 x i16>")


def _decode_q2_k(fn: Function, blk: str) -> Block:
    """block_q2_K {scales[16]: scale | min << 4 per 16 values, qs[64], f16 d, f16 dmin}: unsigned 0..3."""
    packed = fn.load("<16 x i8>", blk)
    sc8 = fn.v(f"and <16 x i8> {packed}, {splat('i8', 15)}")
    sc32 = fn.v(f"zext <16 x i8> {sc8} to <16 x i32>")
    mins = fn.v(f"zext <16 x i8> {_op(fn, 'lshr', '<16 x i8>', packed, splat('i8', 4))} to <16 x i32>")
    both = fn.v(f"shufflevector <16 x i8> {sc8}, <16 x i8> poison, {const_vec('i32', list(range(16)) * 2)}")
    chunks = []
    for h in range(2):
        qs = fn.load("<32 x i8>", fn.gep(blk, 16 + 32 * h))
        for s in range(4):
            c = 4 * h + s
            lane = _lane_scales(fn, sc32, c)
            chunks.append(Chunk(_crumb(fn, qs, s), False, lane, _byte_words(fn, both, c)))
    dm = fn.v(f"fpext <2 x half> {fn.load('<2 x half>', fn.gep(blk, 80))} to <2 x float>")
    d, dmin = (fn.v(f"extractelement <2 x float> {dm}, i64 {i}") for i in range(2))
    return Block(chunks, d, dmin, mins)


def _q3_k_scales(fn: Function, base: str) -> str:
    """Q3_K's 12 bytes -> <16 x i8> signed scales: scale j = (low 4 bits: nibble j // 8 of byte j % 8)
    | (high 2 bits: bits 2 (j // 4) of byte 8 + j % 4) << 4, minus 32."""
    raw = fn.load("<12 x i8>", base)
    v = fn.v(f"shufflevector <12 x i8> {raw}, <12 x i8> poison, {const_vec('i32', list(range(8)) * 2)}")
    lo = fn.v(f"and <16 x i8> {v}, {splat('i8', 15)}")
    hi = fn.v(f"lshr <16 x i8> {v}, {splat('i8', 4)}")
    halves = const_vec("i32", list(range(8)) + list(range(24, 32)))
    low = fn.v(f"shufflevector <16 x i8> {lo}, <16 x i8> {hi}, {halves}")
    top = fn.v(f"shufflevector <12 x i8> {raw}, <12 x i8> poison, {const_vec('i32', [8, 9, 10, 11] * 4)}")
    shifted = fn.v(f"lshr <16 x i8> {top}, {_bare(const_vec('i8', [2 * (j // 4) for j in range(16)]))}")
    high = _op(fn, "shl", "<16 x i8>", _op(fn, "and", "<16 x i8>", shifted, splat("i8", 3)), splat("i8", 4))
    return fn.v(f"sub <16 x i8> {fn.v(f'or <16 x i8> {low}, {high}')}, {splat('i8', 32)}")


def _decode_q3_k(fn: Function, blk: str) -> Block:
    """block_q3_K {hmask[32], qs[64], scales[12], f16 d}: value 128h + 32s + l is bits 2s of
    qs[32h + l] minus 4 unless bit 4h + s of hmask[l] is set (-4 .. 3, signed, as ggml forms it).
    Pair scales as 256 * scale (one vpshufb per chunk; lane sums stay below 2^31: 8 chunks * 4 values
    * 32 * 4 * 127 * 256 < 2^28)."""
    sc8 = _q3_k_scales(fn, fn.gep(blk, 96))
    sc32 = fn.v(f"sext <16 x i8> {sc8} to <16 x i32>")
    both = fn.v(f"shufflevector <16 x i8> {sc8}, <16 x i8> poison, {const_vec('i32', list(range(16)) * 2)}")
    hmask = fn.load("<32 x i8>", blk)
    chunks = []
    for h in range(2):
        qs = fn.load("<32 x i8>", fn.gep(blk, 32 + 32 * h))
        for s in range(4):
            c = 4 * h + s
            low = _crumb(fn, qs, s)
            bit = fn.v(f"and <32 x i8> {hmask}, {splat('i8', (1 << c) - (256 if c == 7 else 0))}")
            keep = fn.v(f"icmp ne <32 x i8> {bit}, zeroinitializer")
            minus4 = _op(fn, "sub", "<32 x i8>", low, splat("i8", 4))
            w = fn.v(f"select <32 x i1> {keep}, <32 x i8> {low}, <32 x i8> {minus4}")
            lane = _lane_scales(fn, sc32, c)
            chunks.append(Chunk(w, True, lane, _byte_words(fn, both, c, high=True)))
    return Block(chunks, fn.load_f16(fn.gep(blk, 108)), scale16_shift=8)


def _decode_iq4_xs(fn: Function, blk: str) -> Block:
    """block_iq4_xs {f16 d, u16 scales_h, scales_l[4], qs[128]}: sub-block ib of 32 has the 6-bit
    scale (nibble ib % 2 of scales_l[ib / 2]) | (bits 2 ib of scales_h) << 4, minus 32, and the
    nibble order of IQ4_NL's blocks into kvalues_iq4nl."""
    sl = fn.load("<4 x i8>", fn.gep(blk, 4))
    pairs = fn.v(f"shufflevector <4 x i8> {sl}, <4 x i8> poison, {const_vec('i32', [0, 0, 1, 1, 2, 2, 3, 3])}")
    wide = fn.v(f"zext <8 x i8> {pairs} to <8 x i16>")
    v16 = "<8 x i16>"
    low = _op(fn, "and", v16, _op(fn, "lshr", v16, wide, _bare(const_vec("i16", [0, 4] * 4))), splat("i16", 15))
    sh = fn.splat_value(8, "i16", fn.load("i16", fn.gep(blk, 2)))
    top = _op(fn, "and", v16, _op(fn, "lshr", v16, sh, _bare(const_vec("i16", range(0, 16, 2)))), splat("i16", 3))
    six = _op(fn, "or", v16, low, _op(fn, "shl", v16, top, splat("i16", 4)))
    ls = _op(fn, "sub", v16, six, splat("i16", 32))
    ls32 = fn.v(f"sext <8 x i16> {ls} to <8 x i32>")
    chunks = []
    for p in range(4):  # sub-blocks 2p, 2p+1 from one 32-byte load: [low nibbles | high nibbles] of each half
        lo, hi = _nibbles(fn, fn.gep(blk, 8 + 32 * p), 32)
        for half in range(2):
            pick = const_vec("i32", [16 * half + i for i in range(16)] + [32 + 16 * half + i for i in range(16)])
            idx = fn.v(f"shufflevector <32 x i8> {lo}, <32 x i8> {hi}, {pick}")
            ib = 2 * p + half
            lane = fn.v(f"shufflevector <8 x i32> {ls32}, <8 x i32> poison, {const_vec('i32', [ib] * 8)}")
            pair = fn.v(f"shufflevector <8 x i16> {ls}, <8 x i16> poison, {const_vec('i32', [ib] * 16)}")
            chunks.append(Chunk(idx, True, lane, pair, IQ4NL_VALUES))
    return Block(chunks, _f16s(fn, blk, 1)[0])


def _e8m0_half(fn: Function, e8: str, n: int = 0) -> str:
    """ggml_e8m0_to_fp32_half of an i8 (n = 0) or <n x i8>: 2^(e - 128) as float bits, (e - 1) << 23,
    or the subnormal 0x200000 << e for e < 2."""
    ty = f"<{n} x i32>" if n else "i32"
    b8, cond = (f"<{n} x i8>", f"<{n} x i1>") if n else ("i8", "i1")
    const = (lambda v: splat("i32", v)) if n else str
    e = fn.v(f"zext {b8} {e8} to {ty}")
    small = fn.v(f"shl {ty} {const(0x200000)}, {e}")
    big = fn.v(f"shl {ty} {fn.v(f'sub {ty} {e}, {const(1)}')}, {const(23)}")
    bits = fn.v(f"select {cond} {fn.v(f'icmp ult {ty} {e}, {const(2)}')}, {ty} {small}, {ty} {big}")
    return fn.v(f"bitcast {ty} {bits} to {f'<{n} x float>' if n else 'float'}")


def _decode_mxfp4(fn: Function, blk: str) -> Block:  # {e8m0 e, qs[16]}: Q4_0's nibble order into kvalues_mxfp4
    chunk = Chunk(_legacy_quants(fn, fn.gep(blk, 1)), True, table=MXFP4_VALUES)
    return Block([chunk], _e8m0_half(fn, fn.load("i8", blk)))


def _table_nibbles(table: tuple) -> tuple[Callable, Callable]:
    """Decoders of {f16 d, qs[16]} blocks whose nibbles (Q4_0's order) index `table` (IQ4_NL, Q4_0)."""

    def decode(fn: Function, blk: str) -> Block:
        return Block([Chunk(_legacy_quants(fn, fn.gep(blk, 2)), True, table=table)], _f16s(fn, blk, 1)[0])

    def decode_pair(fn: Function, a: str, c: str) -> PairBlock:
        low, high = _pair_nibbles(fn, fn.gep(a, 2), fn.gep(c, 2))
        h = fn.v(f"shufflevector <1 x half> {fn.load('<1 x half>', a)}, <1 x half> {fn.load('<1 x half>', c)}, "
                 f"{const_vec('i32', [0, 1])}")
        return PairBlock(low, high, True, table, fn.v(f"fpext <2 x half> {h} to <2 x float>"))

    return decode, decode_pair


_decode_iq4_nl, _pair_iq4_nl = _table_nibbles(IQ4NL_VALUES)
_decode_q4_0_table, _pair_q4_0_table = _table_nibbles(Q4_0_VALUES)


def _pair_mxfp4(fn: Function, a: str, c: str) -> PairBlock:
    low, high = _pair_nibbles(fn, fn.gep(a, 1), fn.gep(c, 1))
    first = fn.v(f"insertelement <2 x i8> poison, i8 {fn.load('i8', a)}, i64 0")
    e = fn.v(f"insertelement <2 x i8> {first}, i8 {fn.load('i8', c)}, i64 1")
    return PairBlock(low, high, True, MXFP4_VALUES, _e8m0_half(fn, e, 2))


LAYOUTS: dict[Q, Layout] = {
    lay.wtype: lay
    for lay in (
        Layout(Q.Q8_0, 32, 34, "q8_0", _decode_q8_0, offset=128, decode_pair=_pair_q8_0),
        Layout(Q.Q4_0, 32, 18, "q8_0", _decode_q4_0_table, float_order="scalar", offset=128,
               decode_pair=_pair_q4_0_table),
        Layout(Q.Q4_1, 32, 20, "q8_1", _decode_q4_1, True, decode_pair=_pair_q4(4)),
        Layout(Q.Q5_0, 32, 22, "q8_0", _decode_q5_0, offset=16, decode_pair=_pair_q5(2)),
        Layout(Q.Q5_1, 32, 24, "q8_1", _decode_q5_1, True, decode_pair=_pair_q5(4)),
        Layout(Q.Q4_K, 256, 144, "q8_k", _decode_q4_k, True, "scalar", decode_wide=_decode_q4_k_wide),
        Layout(Q.Q5_K, 256, 176, "q8_k", _decode_q5_k, True),
        Layout(Q.Q6_K, 256, 210, "q8_k", _decode_q6_k),
        Layout(Q.Q2_K, 256, 84, "q8_k", _decode_q2_k, True, "scalar"),
        Layout(Q.Q3_K, 256, 110, "q8_k", _decode_q3_k),
        Layout(Q.IQ4_XS, 256, 136, "q8_k", _decode_iq4_xs),
        Layout(Q.IQ4_NL, 32, 18, "q8_0", _decode_iq4_nl, float_order="scalar", offset=128, decode_pair=_pair_iq4_nl),
        Layout(Q.MXFP4, 32, 17, "q8_0", _decode_mxfp4, float_order="scalar", offset=12, decode_pair=_pair_mxfp4),
    )
}
