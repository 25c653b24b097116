"""The C library's logf as SPIR-V (`logf_libc`), the softplus the recurrent kernels take their step
sizes through (`softplus`), and a float64 fma that rounds once on every device (`fma_f64`).

Owns: glibc's `__logf` (its FMA build: every multiply-add of the double evaluation one fma, as GCC
contracts them; constants in kinetic/codegen/common/logf.py) and numerics.recurrent.softplus
(x above 20 passes through, else logf(1 + expf(x)), attention.py's expf_libc). Does not own the
kernels that call them (recurrent.py, recurrent_scan.py) or the meaning (kinetic/ir/numerics).

Why the fma is spelled out: Vulkan lets a driver compute a double `Fma` as a multiply and an add
(lavapipe does), and glibc's logf is exact only with its four fmas each rounded once. `fma_f64` forms
one from operations that round exactly as IEEE says (each decorated NoContraction): the product a*b
as the exact pair (uh, ul) by Dekker's TwoProduct (Veltkamp's split), c + uh as the exact pair
(th, tl) by TwoSum, then RN(th + RO(tl + ul)) with RO the sum rounded to odd (the TwoSum's error
says whether it was inexact; an inexact even result steps one ulp toward the error). Boldo and
Melquiond prove this is the fma rounded once (IEEE Trans. Computers 57(4), 2008, "Emulation of a FMA
and correctly rounded sums: proved algorithms using rounding to odd"), without underflow or
overflow: logf's operands here are bounded (|r| < 1/32, |k| < 152), far from both.
"""

from __future__ import annotations

import numpy as np

from kinetic.codegen.common import logf as c
from kinetic.codegen.vulkan.attention import expf_libc, render_float_map
from kinetic.codegen.vulkan.device import Kernel
from kinetic.codegen.vulkan.spirv import Function, Op

WORKGROUP = 64
SPLIT = float(2**27 + 1)  # Veltkamp's constant for doubles: hi keeps 26 bits, lo the rest


def _d(fn: Function, bits: int) -> int:
    """A double constant from its bits."""
    return fn.m.const(fn.m.float_(64), float(np.uint64(bits).view(np.float64)))


def _two_sum(fn: Function, a: int, b: int) -> tuple[int, int]:
    """(s, e): s = RN(a + b) and s + e = a + b exactly (Knuth)."""
    s = fn.fadd(a, b)
    bb = fn.fsub(s, a)
    return s, fn.fadd(fn.fsub(a, fn.fsub(s, bb)), fn.fsub(b, bb))


def _split(fn: Function, a: int) -> tuple[int, int]:
    """Veltkamp's split: a = hi + lo exactly, each of at most 26 significant bits."""
    t = fn.fmul(fn.m.const(fn.m.float_(64), SPLIT), a)
    hi = fn.fsub(t, fn.fsub(t, a))
    return hi, fn.fsub(a, hi)


def _two_product(fn: Function, a: int, b: int) -> tuple[int, int]:
    """(p, e): p = RN(a * b) and p + e = a * b exactly (Dekker), without an fma."""
    p = fn.fmul(a, b)
    ah, al = _split(fn, a)
    bh, bl = _split(fn, b)
    e = fn.fadd(fn.fadd(fn.fadd(fn.fsub(fn.fmul(ah, bh), p), fn.fmul(ah, bl)), fn.fmul(al, bh)), fn.fmul(al, bl))
    return p, e


def _add_round_odd(fn: Function, a: int, b: int) -> int:
    """a + b rounded to odd: the nearest sum, except that an inexact sum with an even last bit steps
    one ulp toward the exact one (its bits +-1 as a 64-bit integer, carried across the two words)."""
    m = fn.m
    f64, u32 = m.float_(64), m.u32
    s, e = _two_sum(fn, a, b)
    words = fn.bitcast(s, m.vector(u32, 2))
    lo, hi = fn.emit(Op.CompositeExtract, u32, words, 0), fn.emit(Op.CompositeExtract, u32, words, 1)
    zero = m.const(f64, 0.0)
    away = fn.logical_eq(fn.fcmp(Op.FOrdGreaterThan, e, zero), fn.fcmp(Op.FOrdGreaterThan, s, zero))
    up_lo, up_hi = fn.iadd(lo, m.u(1)), fn.iadd(hi, fn.select(fn.icmp(Op.IEqual, lo, m.u(0xFFFFFFFF)), m.u(1), m.u(0)))
    down_lo, down_hi = fn.isub(lo, m.u(1)), fn.isub(hi, fn.select(fn.icmp(Op.IEqual, lo, m.u(0)), m.u(1), m.u(0)))
    stepped = fn.bitcast(fn.emit(Op.CompositeConstruct, m.vector(u32, 2), fn.select(away, up_lo, down_lo),
                                 fn.select(away, up_hi, down_hi)), f64)
    even = fn.icmp(Op.IEqual, fn.band(lo, m.u(1)), m.u(0))
    inexact = fn.fcmp(Op.FUnordNotEqual, e, zero)
    return fn.select(fn.logical_and(even, inexact), stepped, s)


def fma_f64(fn: Function, a: int, b: int, addend: int) -> int:
    """a*b + addend for doubles, rounded once (see the module docstring; no underflow or overflow)."""
    uh, ul = _two_product(fn, a, b)
    th, tl = _two_sum(fn, addend, uh)
    return fn.fadd(th, _add_round_odd(fn, tl, ul))


def _table_pick(fn: Function, i: int, column: int) -> int:
    """Column 0 (1/c) or 1 (log c) of the table slot i (a u32 id), by a chain of selects."""
    value = _d(fn, c.TABLE[0][column])
    for slot in range(1, len(c.TABLE)):
        value = fn.select(fn.icmp(Op.IEqual, i, fn.m.u(slot)), _d(fn, c.TABLE[slot][column]), value)
    return value


def logf_libc(fn: Function, x: int) -> int:
    """glibc's logf of an f32 id: log(1) = +0, log(+-0) = -inf, log(inf) = inf, NaN or x < 0 give
    (x - x) / (x - x), a subnormal is normalized first; otherwise the double evaluation above."""
    m = fn.m
    f64 = m.float_(64)
    ix = fn.bitcast(x, m.u32)
    subnormal_ix = fn.isub(fn.bitcast(fn.fmul(x, m.f(2.0**23)), m.u32), m.u(23 << 23))
    ix = fn.select(fn.icmp(Op.ULessThan, ix, m.u(0x00800000)), subnormal_ix, ix)
    tmp = fn.isub(ix, m.u(c.OFF))
    i = fn.band(fn.shr(tmp, m.u(19)), m.u(15))
    k = fn.emit(Op.ShiftRightArithmetic, m.i32, fn.bitcast(tmp, m.i32), m.u(23))
    iz = fn.isub(ix, fn.band(tmp, m.u(0xFF800000)))
    invc, logc = _table_pick(fn, i, 0), _table_pick(fn, i, 1)
    z = fn.convert(fn.bitcast(iz, m.f32), f64)
    r = fma_f64(fn, z, invc, m.const(f64, -1.0))
    y0 = fma_f64(fn, fn.convert(k, f64), _d(fn, c.LN2), logc)
    r2 = fn.fmul(r, r)
    a0, a1, a2 = (_d(fn, bits) for bits in c.POLY)
    y = fma_f64(fn, a1, r, a2)
    y = fma_f64(fn, a0, r2, y)
    y = fma_f64(fn, y, r2, fn.fadd(y0, r))
    result = fn.convert(y, m.f32)
    bits = fn.bitcast(x, m.u32)
    invalid = fn.logical_or(fn.icmp(Op.UGreaterThanEqual, bits, m.u(0x80000000)),
                            fn.icmp(Op.UGreaterThan, bits, m.u(0x7F800000)))  # x < 0 or NaN (-0: below)
    nan = fn.fdiv(fn.fsub(x, x), fn.fsub(x, x))
    result = fn.select(invalid, nan, result)
    result = fn.select(fn.icmp(Op.IEqual, bits, m.u(0x7F800000)), x, result)
    result = fn.select(fn.icmp(Op.IEqual, fn.shl(bits, m.u(1)), m.u(0)), m.f(float("-inf")), result)
    return fn.select(fn.icmp(Op.IEqual, bits, m.u(0x3F800000)), m.f(0.0), result)


def softplus(fn: Function, expf_table, v: int) -> int:
    """numerics.recurrent.softplus of the f32 id v: v above 20 as it is, else logf(1 + expf(v)) with
    the C library's functions (`expf_table`: the u32 buffer of attention.expf_table_words)."""
    m = fn.m
    soft = logf_libc(fn, fn.fadd(m.f(1.0), expf_libc(fn, expf_table, v)))
    return fn.select(fn.fcmp(Op.FOrdGreaterThan, v, m.f(20.0)), v, soft)


def render_map(which: str) -> Kernel:
    """y[i] = logf_libc(x[i]) ("logf") or softplus(x[i]) ("softplus") for i < n (push constant): the
    tests' window on these functions (attention.render_float_map)."""
    if which == "logf":
        return render_float_map("logf_libc_map", lambda fn, table, v: logf_libc(fn, v))
    return render_float_map("softplus_libc_map", softplus)
