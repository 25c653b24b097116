"""Embedding lookups from tables of the K-quant and float types on Vulkan.

Owns: `render_embed(wtype, n_embd)` for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, F16 and BF16 tables and
`SUPPORTED` (Q8_0 is gather.py's `render_embed_q8_0`, with the same bindings and push constants).
Does not own the dispatch (kernels.py's record_embed, one per part of a split table) or the meaning
(kinetic/ir/reference.py's `embed`: quants.dequantize_rows, that is gguf.quants' dequantization).

One invocation per value, each computing its value with gguf's float operations in gguf's order, so
the lookup is the reference bit for bit: a scale dl = d * sc (f32), then dl * q, minus dmin * m for
Q2_K, Q4_K and Q5_K, each product and the difference rounded on its own (Vulkan's float multiply and
add are correctly rounded; every add and multiply is NoContraction); F16 and BF16 values are
converted exactly. The bit layouts are those of kinetic/codegen/cuda/embed.py's docstring (ggml's
block_q*_K); blocks of every K-quant type start at even offsets, and Q4_K / Q5_K (144 and 176 bytes)
at multiples of 4, which matvec_k's scale readers need.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.vulkan import builders
from kinetic.codegen.vulkan.device import Kernel, Unsupported
from kinetic.codegen.vulkan.gather import render_lookup
from kinetic.codegen.vulkan.matvec_k import k4_scale_words, scale_min_k4
from kinetic.codegen.vulkan.spirv import Function
from kinetic.ir.quants import QUANT_TYPES

SUPPORTED = (Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.F16, Q.BF16)


class _Block:
    """Reads from one super-block of a table: bytes, f16 fields, and the values as f32."""

    def __init__(self, fn: Function, table, base: int):
        self.fn, self.table, self.base = fn, table, base

    def at(self, offset: int, plus: int | None = None) -> int:
        """The byte offset base + offset (+ an id)."""
        m = self.fn.m
        at = self.fn.iadd(self.base, m.u(offset))
        return at if plus is None else self.fn.iadd(at, plus)

    def byte(self, offset: int, plus: int | None = None) -> int:
        fn, m = self.fn, self.fn.m
        at = self.at(offset, plus)
        word = fn.buf_load(self.table, fn.shr(at, m.u(2)))
        return fn.bits_u(word, None, 8, offset_id=fn.shl(fn.band(at, m.u(3)), m.u(3)))

    def f16(self, offset: int) -> int:
        return builders.f16_bits_to_f32(self.fn, builders.load_u16_at(self.fn, self.table, self.at(offset)))

    def f32(self, value: int) -> int:
        """An integer id (u32 or i32) as f32."""
        return self.fn.convert(value, self.fn.m.f32)


def _bits(fn: Function, value: int, shift: int, width: int) -> int:
    """(value >> shift) & (2^width - 1) for u32 ids."""
    return fn.bits_u(value, None, width, offset_id=shift)


def _q2_k(fn: Function, blk: _Block, j: int) -> int:
    m = fn.m
    h, s, lane = fn.shr(j, m.u(7)), fn.band(fn.shr(j, m.u(5)), m.u(3)), fn.band(j, m.u(31))
    sub = blk.byte(0, fn.shr(j, m.u(4)))
    q = _bits(fn, blk.byte(16, fn.iadd(fn.imul(h, m.u(32)), lane)), fn.imul(s, m.u(2)), 2)
    dl = fn.fmul(blk.f16(80), blk.f32(fn.band(sub, m.u(15))))
    return fn.fsub(fn.fmul(dl, blk.f32(q)), fn.fmul(blk.f16(82), blk.f32(fn.shr(sub, m.u(4)))))


def _q3_k(fn: Function, blk: _Block, j: int) -> int:
    m = fn.m
    h, s, lane = fn.shr(j, m.u(7)), fn.band(fn.shr(j, m.u(5)), m.u(3)), fn.band(j, m.u(31))
    low = _bits(fn, blk.byte(32, fn.iadd(fn.imul(h, m.u(32)), lane)), fn.imul(s, m.u(2)), 2)
    high = _bits(fn, blk.byte(0, lane), fn.shr(j, m.u(5)), 1)
    sub = fn.shr(j, m.u(4))
    sc_low = _bits(fn, blk.byte(96, fn.band(sub, m.u(7))), fn.imul(fn.shr(sub, m.u(3)), m.u(4)), 4)
    sc_high = _bits(fn, blk.byte(104, fn.band(sub, m.u(3))), fn.imul(fn.shr(sub, m.u(2)), m.u(2)), 2)
    sc = fn.isub(fn.bitcast(fn.bor(sc_low, fn.shl(sc_high, m.u(4))), m.i32), m.i(32))
    q = fn.isub(fn.bitcast(fn.bor(low, fn.shl(high, m.u(2))), m.i32), m.i(4))
    return fn.fmul(fn.fmul(blk.f16(108), blk.f32(sc)), blk.f32(q))


def _q45_k(qs_at: int, with_high: bool):
    def value(fn: Function, blk: _Block, j: int) -> int:
        m = fn.m
        c, lane = fn.shr(j, m.u(5)), fn.band(j, m.u(31))
        q = _bits(fn, blk.byte(qs_at, fn.iadd(fn.imul(fn.shr(c, m.u(1)), m.u(32)), lane)),
                  fn.imul(fn.band(c, m.u(1)), m.u(4)), 4)
        if with_high:
            q = fn.bor(q, fn.shl(_bits(fn, blk.byte(16, lane), c, 1), m.u(4)))
        sc, mn = scale_min_k4(fn, k4_scale_words(fn, blk.table, blk.base), c)
        return fn.fsub(fn.fmul(fn.fmul(blk.f16(0), blk.f32(sc)), blk.f32(q)), fn.fmul(blk.f16(2), blk.f32(mn)))

    return value


def _q6_k(fn: Function, blk: _Block, j: int) -> int:
    m = fn.m
    h, a = fn.shr(j, m.u(7)), fn.band(j, m.u(127))
    low = _bits(fn, blk.byte(0, fn.iadd(fn.imul(h, m.u(64)), fn.band(a, m.u(63)))),
                fn.imul(fn.shr(a, m.u(6)), m.u(4)), 4)
    high = _bits(fn, blk.byte(128, fn.iadd(fn.imul(h, m.u(32)), fn.band(a, m.u(31)))),
                 fn.imul(fn.shr(a, m.u(5)), m.u(2)), 2)
    sc = fn.bits_s(fn.bitcast(blk.byte(192, fn.shr(j, m.u(4))), m.i32), 0, 8)
    q = fn.isub(fn.bitcast(fn.bor(low, fn.shl(high, m.u(4))), m.i32), m.i(32))
    return fn.fmul(fn.fmul(blk.f16(208), blk.f32(sc)), blk.f32(q))


_SUPERBLOCK = {Q.Q2_K: _q2_k, Q.Q3_K: _q3_k, Q.Q4_K: _q45_k(16, False), Q.Q5_K: _q45_k(48, True), Q.Q6_K: _q6_k}


def _value(fn: Function, wtype: Q, table, row_start: int, i: int) -> int:
    """Value i of the row whose first byte is row_start, as f32."""
    m = fn.m
    if wtype in (Q.F16, Q.BF16):
        bits = builders.load_u16_at(fn, table, fn.iadd(row_start, fn.imul(i, m.u(2))))
        if wtype is Q.F16:
            return builders.f16_bits_to_f32(fn, bits)
        return fn.bitcast(fn.shl(bits, m.u(16)), m.f32)
    base = fn.iadd(row_start, fn.imul(fn.shr(i, m.u(8)), m.u(QUANT_TYPES[wtype].block_bytes)))
    return _SUPERBLOCK[wtype](fn, _Block(fn, table, base), fn.band(i, m.u(255)))


def render_embed(wtype: Q, n_embd: int) -> Kernel:
    """Rows of a table of `wtype` dequantized as the reference: bindings table u32 (raw GGUF bytes),
    ids u32 [rows], out f32 [rows, n_embd]. Push constants: rows, first and count (the table holds ids
    first .. first+count-1; rows whose id is elsewhere are left alone), as render_embed_q8_0."""
    if wtype not in SUPPORTED or wtype is Q.Q8_0:
        raise Unsupported(f"embedding table of {wtype.name} (Vulkan has lookups for "
                          f"{', '.join(t.name for t in SUPPORTED)})")
    try:
        row_bytes = QUANT_TYPES[wtype].row_bytes(n_embd)
    except ValueError as e:
        raise Unsupported(f"embedding: {e}") from None
    return render_lookup(f"embed_{wtype.name.lower()}_{n_embd}", n_embd,
                         lambda fn, table, mine, i: _value(fn, wtype, table, fn.imul(mine, fn.m.u(row_bytes)), i))
