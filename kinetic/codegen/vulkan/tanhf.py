"""The C library's tanhf as SPIR-V: `tanhf_libc(fn, x)`, for the soft-cap kernel.

Owns: glibc's tanhf and the expm1f it calls (fdlibm's float algorithm) as float operations each
decorated NoContraction (spirv_function.Function's default), so each rounds once and none becomes an
fma; every branch is computed and the right one selected, as codegen/common/tanhf.py's `tanhf_steps`
does (its constants and statement live there; benchmarks/tanhf_exhaustive.py checks those steps
against the C library on every input that reaches expm1f). Vulkan allows OpFDiv 2.5 ulp; lavapipe
divides exactly, as the SiLU kernel relies on too (elementwise.py).
"""

from __future__ import annotations

import struct

from kinetic.codegen.common import tanhf as t
from kinetic.codegen.vulkan.spirv import Function, Op


def _c(fn: Function, bits: int) -> int:
    return fn.m.f(struct.unpack("<f", struct.pack("<I", bits))[0])


def _times_2k(fn: Function, y: int, k: int) -> int:
    """y with the i32 k added to its exponent field."""
    m = fn.m
    return fn.bitcast(fn.iadd(fn.bitcast(y, m.i32), fn.shl(k, m.i(23))), m.f32)


def _reduce(fn: Function, x: int, hx: int, neg: int) -> tuple[int, int, int]:
    """(k, the reduced x, its correction c), k as an i32: x - k ln2 in two parts when |x| > ln2/2."""
    m = fn.m
    one_step = fn.icmp(Op.ULessThan, hx, m.u(t.EXPM1_ONE_STEP))
    half = fn.select(neg, m.f(-0.5), m.f(0.5))
    k_far = fn.convert(fn.fadd(fn.fmul(_c(fn, t.INV_LN2), x), half), m.i32)  # truncated toward zero
    k_one = fn.select(neg, m.i(-1), m.i(1))
    k = fn.select(fn.icmp(Op.UGreaterThan, hx, m.u(t.EXPM1_REDUCE)), fn.select(one_step, k_one, k_far), m.i(0))
    kf = fn.convert(k, m.f32)
    ln2_hi, ln2_lo = _c(fn, t.LN2_HI), _c(fn, t.LN2_LO)
    hi = fn.select(one_step, fn.select(neg, fn.fadd(x, ln2_hi), fn.fsub(x, ln2_hi)), fn.fsub(x, fn.fmul(kf, ln2_hi)))
    lo = fn.select(one_step, fn.select(neg, fn.fneg(ln2_lo), ln2_lo), fn.fmul(kf, ln2_lo))
    reduced = fn.icmp(Op.INotEqual, k, m.i(0))
    r = fn.select(reduced, fn.fsub(hi, lo), x)
    c = fn.select(reduced, fn.fsub(fn.fsub(hi, r), lo), m.f(0.0))
    return k, r, c


def _expm1f(fn: Function, x: int) -> int:
    """expm1f as tanhf calls it (-2 <= x < 0 or 2 <= x < 44)."""
    m = fn.m
    hx = fn.band(fn.bitcast(x, m.u32), m.u(0x7FFFFFFF))
    neg = fn.fcmp(Op.FOrdLessThan, x, m.f(0.0))
    k, r, c = _reduce(fn, x, hx, neg)
    hfx = fn.fmul(m.f(0.5), r)
    hxs = fn.fmul(r, hfx)
    poly = fn.fmul(hxs, _c(fn, t.Q[4]))
    for q in reversed(t.Q[:4]):
        poly = fn.fmul(hxs, fn.fadd(_c(fn, q), poly))
    r1 = fn.fadd(m.f(1.0), poly)
    tt = fn.fsub(m.f(3.0), fn.fmul(r1, hfx))
    e = fn.fmul(hxs, fn.fdiv(fn.fsub(r1, tt), fn.fsub(m.f(6.0), fn.fmul(r, tt))))
    k0 = fn.fsub(r, fn.fsub(fn.fmul(r, e), hxs))
    e = fn.fsub(fn.fsub(fn.fmul(r, fn.fsub(e, c)), c), hxs)
    minus1 = fn.fsub(fn.fmul(m.f(0.5), fn.fsub(r, e)), m.f(0.5))
    plus1 = fn.select(fn.fcmp(Op.FOrdLessThan, r, m.f(-0.25)),
                      fn.fmul(m.f(-2.0), fn.fsub(e, fn.fadd(r, m.f(0.5)))),
                      fn.fadd(m.f(1.0), fn.fmul(m.f(2.0), fn.fsub(r, e))))
    e_minus_r = fn.fsub(e, r)
    far = fn.fsub(_times_2k(fn, fn.fsub(m.f(1.0), e_minus_r), k), m.f(1.0))
    k_near, k_mid = _clamped(fn, k, 22), _clamped(fn, k, 126)  # in range where that form is not selected
    one_less = fn.bitcast(fn.isub(m.u(0x3F800000), fn.shr(m.u(0x1000000), k_near)), m.f32)  # 1 - 2^-k
    near = _times_2k(fn, fn.fsub(one_less, e_minus_r), k)
    two_minus_k = fn.bitcast(fn.shl(fn.isub(m.u(0x7F), k_mid), m.u(23)), m.f32)
    mid = _times_2k(fn, fn.fadd(fn.fsub(r, fn.fadd(e, two_minus_k)), m.f(1.0)), k)
    far_k = fn.logical_or(fn.icmp(Op.SLessThanEqual, k, m.i(-2)), fn.icmp(Op.SGreaterThan, k, m.i(56)))
    y = fn.select(fn.icmp(Op.SLessThan, k, m.i(23)), near, mid)
    y = fn.select(far_k, far, y)
    y = fn.select(fn.icmp(Op.IEqual, k, m.i(1)), plus1, y)
    y = fn.select(fn.icmp(Op.IEqual, k, m.i(-1)), minus1, y)
    y = fn.select(fn.icmp(Op.IEqual, k, m.i(0)), k0, y)
    saturated = fn.logical_and(neg, fn.icmp(Op.UGreaterThanEqual, hx, m.u(t.EXPM1_SATURATE)))
    y = fn.select(saturated, fn.fsub(_c(fn, t.TINY), m.f(1.0)), y)
    return fn.select(fn.icmp(Op.ULessThan, hx, m.u(t.EXPM1_TINY)), x, y)


def _clamped(fn: Function, k: int, high: int) -> int:
    """The i32 k clamped to [0, high], as a u32: a shift count that stays defined in the lanes where
    the form it serves is not the one selected."""
    m = fn.m
    k = fn.select(fn.icmp(Op.SLessThan, k, m.i(0)), m.i(0), k)
    return fn.bitcast(fn.select(fn.icmp(Op.SGreaterThan, k, m.i(high)), m.i(high), k), m.u32)


def tanhf_libc(fn: Function, x: int) -> int:
    """glibc's tanhf of the f32 x."""
    m = fn.m
    hx = fn.band(fn.bitcast(x, m.u32), m.u(0x7FFFFFFF))
    neg = fn.icmp(Op.UGreaterThanEqual, fn.bitcast(x, m.u32), m.u(0x80000000))
    a = fn.bitcast(hx, m.f32)
    large = fn.icmp(Op.UGreaterThanEqual, hx, m.u(t.TANH_LARGE))
    e = _expm1f(fn, fn.select(large, fn.fadd(a, a), fn.fmul(a, m.f(-2.0))))
    two_e = fn.fadd(e, m.f(2.0))
    z = fn.select(large, fn.fsub(m.f(1.0), fn.fdiv(m.f(2.0), two_e)), fn.fdiv(fn.fneg(e), two_e))
    z = fn.select(fn.icmp(Op.UGreaterThanEqual, hx, m.u(t.TANH_ONE)), fn.fsub(m.f(1.0), _c(fn, t.TINY)), z)
    z = fn.select(neg, fn.fneg(z), z)
    z = fn.select(fn.icmp(Op.ULessThan, hx, m.u(t.TANH_TINY)), fn.fmul(x, fn.fadd(m.f(1.0), x)), z)
    z = fn.select(fn.icmp(Op.IEqual, hx, m.u(0)), x, z)
    inverse = fn.fdiv(m.f(1.0), x)
    special = fn.select(neg, fn.fsub(inverse, m.f(1.0)), fn.fadd(inverse, m.f(1.0)))  # +-inf -> +-1, NaN
    return fn.select(fn.icmp(Op.UGreaterThanEqual, hx, m.u(0x7F800000)), special, z)
