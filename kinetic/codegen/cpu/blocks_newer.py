"""Block decoders of Q2_K, Q3_K, IQ4_XS and the codebook formats IQ4_NL, Q4_0 (read as a codebook)
and MXFP4, whose reference orders are kinetic/ir/quant_dots.py's.

Owns: how one block's bytes become `Block` chunks (4-bit codes with their codebook for IQ4_NL,
IQ4_XS, MXFP4, Q4_0; the kernel looks them up) and, for the block-32 codebook formats, two rows'
`PairBlock`. Layout facts are ggml's (ggml-common.h); codebooks are QUANT_TYPES'. No loops, no
accumulation order: that is matmul_ir's.
"""

from __future__ import annotations

from collections.abc import Callable

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.block_types import Block, Chunk, PairBlock
from kinetic.codegen.cpu.blocks_classic import bare, f16s, legacy_quants, nibbles, pair_nibbles
from kinetic.codegen.cpu.llvm_ir import Function, const_vec, splat
from kinetic.ir.quants import QUANT_TYPES


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


def decode_q2_k(fn: Function, blk: str) -> Block:
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
    shifted = fn.v(f"lshr <16 x i8> {top}, {bare(const_vec('i8', [2 * (j // 4) for j in range(16)]))}")
    high = _op(fn, "shl", "<16 x i8>", _op(fn, "and", "<16 x i8>", shifted, splat("i8", 3)), splat("i8", 4))
    return fn.v(f"sub <16 x i8> {fn.v(f'or <16 x i8> {low}, {high}')}, {splat('i8', 32)}")


def decode_q3_k(fn: Function, blk: str) -> Block:
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


def decode_iq4_xs(fn: Function, blk: str) -> Block:
    """block_iq4_xs {f16 d, u16 scales_h, scales_l[4], qs[128]}: sub-block ib of 32 has the 6-bit
    scale (nibble ib % 2 of scales_l[ib / 2]) | (bits 2 ib of scales_h) << 4, minus 32, and the
    nibble order of IQ4_NL's blocks into kvalues_iq4nl."""
    sl = fn.load("<4 x i8>", fn.gep(blk, 4))
    pairs = fn.v(f"shufflevector <4 x i8> {sl}, <4 x i8> poison, {const_vec('i32', [0, 0, 1, 1, 2, 2, 3, 3])}")
    wide = fn.v(f"zext <8 x i8> {pairs} to <8 x i16>")
    v16 = "<8 x i16>"
    low = _op(fn, "and", v16, _op(fn, "lshr", v16, wide, bare(const_vec("i16", [0, 4] * 4))), splat("i16", 15))
    sh = fn.splat_value(8, "i16", fn.load("i16", fn.gep(blk, 2)))
    top = _op(fn, "and", v16, _op(fn, "lshr", v16, sh, bare(const_vec("i16", range(0, 16, 2)))), splat("i16", 3))
    six = _op(fn, "or", v16, low, _op(fn, "shl", v16, top, splat("i16", 4)))
    ls = _op(fn, "sub", v16, six, splat("i16", 32))
    ls32 = fn.v(f"sext <8 x i16> {ls} to <8 x i32>")
    chunks = []
    for p in range(4):  # sub-blocks 2p, 2p+1 from one 32-byte load: [low nibbles | high nibbles] of each half
        lo, hi = nibbles(fn, fn.gep(blk, 8 + 32 * p), 32)
        for half in range(2):
            pick = const_vec("i32", [16 * half + i for i in range(16)] + [32 + 16 * half + i for i in range(16)])
            idx = fn.v(f"shufflevector <32 x i8> {lo}, <32 x i8> {hi}, {pick}")
            ib = 2 * p + half
            lane = fn.v(f"shufflevector <8 x i32> {ls32}, <8 x i32> poison, {const_vec('i32', [ib] * 8)}")
            pair = fn.v(f"shufflevector <8 x i16> {ls}, <8 x i16> poison, {const_vec('i32', [ib] * 16)}")
            chunks.append(Chunk(idx, True, lane, pair, QUANT_TYPES[Q.IQ4_XS].codebook))
    return Block(chunks, f16s(fn, blk, 1)[0])


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


def decode_mxfp4(fn: Function, blk: str) -> Block:  # {e8m0 e, qs[16]}: Q4_0's nibble order into kvalues_mxfp4
    chunk = Chunk(legacy_quants(fn, fn.gep(blk, 1)), True, table=QUANT_TYPES[Q.MXFP4].codebook)
    return Block([chunk], _e8m0_half(fn, fn.load("i8", blk)))


def _table_nibbles(table: tuple) -> tuple[Callable, Callable]:
    """Decoders of {f16 d, qs[16]} blocks whose nibbles (Q4_0's order) index `table` (IQ4_NL, Q4_0)."""

    def decode(fn: Function, blk: str) -> Block:
        return Block([Chunk(legacy_quants(fn, fn.gep(blk, 2)), True, table=table)], f16s(fn, blk, 1)[0])

    def decode_pair(fn: Function, a: str, c: str) -> PairBlock:
        low, high = pair_nibbles(fn, fn.gep(a, 2), fn.gep(c, 2))
        h = fn.v(f"shufflevector <1 x half> {fn.load('<1 x half>', a)}, <1 x half> {fn.load('<1 x half>', c)}, "
                 f"{const_vec('i32', [0, 1])}")
        return PairBlock(low, high, True, table, fn.v(f"fpext <2 x half> {h} to <2 x float>"))

    return decode, decode_pair


decode_iq4_nl, pair_iq4_nl = _table_nibbles(QUANT_TYPES[Q.IQ4_NL].codebook)
# Q4_0 runs as IQ4_NL does, its nibble q standing for q - 8 (its codebook)
decode_q4_0_table, pair_q4_0_table = _table_nibbles(QUANT_TYPES[Q.Q4_0].codebook)


def pair_mxfp4(fn: Function, a: str, c: str) -> PairBlock:
    low, high = pair_nibbles(fn, fn.gep(a, 1), fn.gep(c, 1))
    first = fn.v(f"insertelement <2 x i8> poison, i8 {fn.load('i8', a)}, i64 0")
    e = fn.v(f"insertelement <2 x i8> {first}, i8 {fn.load('i8', c)}, i64 1")
    return PairBlock(low, high, True, QUANT_TYPES[Q.MXFP4].codebook, _e8m0_half(fn, e, 2))
