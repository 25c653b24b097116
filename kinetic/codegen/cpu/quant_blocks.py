"""Weight block layouts (ggml's) decoded into int8 vectors: what one block contributes to a dot.

Owns: for each supported weight type, how one block's bytes become 32-byte chunks of small integers
(signed or unsigned) with their integer scales, the block's float scale, and the term its minimum
adds. Layout facts are ggml's (block_q4_1 = {f16 d, f16 m, u8 qs[16]}, ...), read from its headers
and from `gguf.quants`' dequantizers; no code is copied. It owns no loops and no accumulation order:
that is `matmul_ir`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.llvm_ir import Function, const_vec, splat


@dataclass(frozen=True)
class Chunk:
    """32 weights as <32 x i8> (`signed` tells how to read them) and an optional <8 x i32> lane scale."""

    w: str
    signed: bool
    lane_scale: str | None = None


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


@dataclass(frozen=True)
class Layout:
    wtype: Q
    block: int
    block_bytes: int
    activation: str  # "q8_0", "q8_1" or "q8_k"
    decode: Callable[[Function, str], Block]
    has_min: bool = False  # the block's decode sets min_scale (and mins for k-quants)
    # how the float side sums (matmul_ir): "lanes" keeps 8 float lanes per row; "scalar" sums the
    # block's int32 lanes first and keeps one float accumulator (Q4_K, ggml's repacked gemv)
    float_order: str = "lanes"


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


def _offset(fn: Function, w: str, k: int) -> str:
    return fn.v(f"sub <32 x i8> {w}, {splat('i8', k)}")


def _decode_q8_0(fn: Function, blk: str) -> Block:
    w = fn.load("<32 x i8>", fn.gep(blk, 2))
    return Block([Chunk(w, True)], fn.load_f16(blk))


def _decode_q4_0(fn: Function, blk: str) -> Block:
    w = _offset(fn, _legacy_quants(fn, fn.gep(blk, 2)), 8)
    return Block([Chunk(w, True)], fn.load_f16(blk))


def _decode_q4_1(fn: Function, blk: str) -> Block:
    w = _legacy_quants(fn, fn.gep(blk, 4))
    return Block([Chunk(w, False)], fn.load_f16(blk), min_scale=fn.load_f16(fn.gep(blk, 2)))


def _decode_q5_0(fn: Function, blk: str) -> Block:
    w = _with_high_bits(fn, _legacy_quants(fn, fn.gep(blk, 6)), fn.gep(blk, 2))
    return Block([Chunk(_offset(fn, w, 16), True)], fn.load_f16(blk))


def _decode_q5_1(fn: Function, blk: str) -> Block:
    w = _with_high_bits(fn, _legacy_quants(fn, fn.gep(blk, 8)), fn.gep(blk, 4))
    return Block([Chunk(w, False)], fn.load_f16(blk), min_scale=fn.load_f16(fn.gep(blk, 2)))


def _byte(fn: Function, base: str, k: int) -> str:
    b = fn.load("i8", fn.gep(base, k))
    return fn.v(f"zext i8 {b} to i32")


def _k4_scales(fn: Function, base: str) -> tuple[list[str], list[str]]:
    """Q4_K/Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins (i32), ggml's packing."""
    q = [_byte(fn, base, k) for k in range(12)]
    scales, mins = [], []
    for j in range(4):
        scales.append(fn.v(f"and i32 {q[j]}, 63"))
        mins.append(fn.v(f"and i32 {q[j + 4]}, 63"))
    for j in range(4, 8):
        top_s = fn.v(f"shl i32 {fn.v(f'lshr i32 {q[j - 4]}, 6')}, 4")
        top_m = fn.v(f"shl i32 {fn.v(f'lshr i32 {q[j]}, 6')}, 4")
        scales.append(fn.v(f"or i32 {fn.v(f'and i32 {q[j + 4]}, 15')}, {top_s}"))
        mins.append(fn.v(f"or i32 {fn.v(f'lshr i32 {q[j + 4]}, 4')}, {top_m}"))
    return scales, mins


def _lanes(fn: Function, first: str, second: str | None = None) -> str:
    """<8 x i32>: all lanes `first`, or lanes 0-3 `first` and 4-7 `second`."""
    v = fn.v(f"insertelement <2 x i32> poison, i32 {first}, i64 0")
    v = fn.v(f"insertelement <2 x i32> {v}, i32 {second or first}, i64 1")
    return fn.v(f"shufflevector <2 x i32> {v}, <2 x i32> poison, {const_vec('i32', [0] * 4 + [1] * 4)}")


def _mins16(fn: Function, mins: list[str]) -> str:
    """<16 x i32> with mins[j] at positions 2j and 2j+1 (one per 16 activations)."""
    v = "poison"
    for j, m in enumerate(mins):
        v = fn.v(f"insertelement <8 x i32> {v}, i32 {m}, i64 {j}")
    return fn.v(f"shufflevector <8 x i32> {v}, <8 x i32> poison, {const_vec('i32', [j // 2 for j in range(16)])}")


def _decode_q4_k(fn: Function, blk: str) -> Block:
    scales, mins = _k4_scales(fn, fn.gep(blk, 4))
    chunks = []
    for pair in range(4):  # 64 elements: low nibbles of 32 bytes, then their high nibbles
        lo, hi = _nibbles(fn, fn.gep(blk, 16 + 32 * pair), 32)
        chunks += [Chunk(lo, False, _lanes(fn, scales[2 * pair])), Chunk(hi, False, _lanes(fn, scales[2 * pair + 1]))]
    return Block(chunks, fn.load_f16(blk), fn.load_f16(fn.gep(blk, 2)), _mins16(fn, mins))


def _bit_plane(fn: Function, qh: str, shift: int, mask: int) -> str:
    """((qh >> shift) & mask) << 4 on <32 x i8>: high bits moved above a nibble."""
    shifted = fn.v(f"lshr <32 x i8> {qh}, {splat('i8', shift)}")
    masked = fn.v(f"and <32 x i8> {shifted}, {splat('i8', mask)}")
    return fn.v(f"shl <32 x i8> {masked}, {splat('i8', 4)}")


def _decode_q5_k(fn: Function, blk: str) -> Block:
    scales, mins = _k4_scales(fn, fn.gep(blk, 4))
    qh = fn.load("<32 x i8>", fn.gep(blk, 16))
    chunks = []
    for pair in range(4):  # chunk c = 2*pair (+1): nibble of qs[32*pair + l], bit c of qh[l] as bit 4
        nibbles = _nibbles(fn, fn.gep(blk, 48 + 32 * pair), 32)
        for half, nib in enumerate(nibbles):
            c = 2 * pair + half
            w = fn.v(f"or <32 x i8> {nib}, {_bit_plane(fn, qh, c, 1)}")
            chunks.append(Chunk(w, False, _lanes(fn, scales[c])))
    return Block(chunks, fn.load_f16(blk), fn.load_f16(fn.gep(blk, 2)), _mins16(fn, mins))


def _decode_q6_k(fn: Function, blk: str) -> Block:
    """Unsigned 6-bit quants (0..63) with their int8 scale per 16; the -32 offset is not applied to
    the weights but through the activation sums (`offsets`), as ggml_vec_dot_q6_K_q8_K does, which
    moves it between lanes: the lane sums are ggml's, not only their total."""
    sc = fn.v(f"sext <16 x i8> {fn.load('<16 x i8>', fn.gep(blk, 192))} to <16 x i32>")
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
            chunks.append(Chunk(w, False, lane_scale))
    offsets = fn.v(f"shl <16 x i32> {sc}, {splat('i32', 5)}")  # 32 * sc
    return Block(chunks, fn.load_f16(fn.gep(blk, 208)), offsets=offsets)


LAYOUTS: dict[Q, Layout] = {
    lay.wtype: lay
    for lay in (
        Layout(Q.Q8_0, 32, 34, "q8_0", _decode_q8_0),
        Layout(Q.Q4_0, 32, 18, "q8_0", _decode_q4_0),
        Layout(Q.Q4_1, 32, 20, "q8_1", _decode_q4_1, True),
        Layout(Q.Q5_0, 32, 22, "q8_0", _decode_q5_0),
        Layout(Q.Q5_1, 32, 24, "q8_1", _decode_q5_1, True),
        Layout(Q.Q4_K, 256, 144, "q8_k", _decode_q4_k, True, "scalar"),
        Layout(Q.Q5_K, 256, 176, "q8_k", _decode_q5_k, True),
        Layout(Q.Q6_K, 256, 210, "q8_k", _decode_q6_k),
    )
}
