"""glibc's tanhf as data: the constants and the float steps every device's bit-identical tanhf follows.

Owns: the constants of the C library's `tanhf` as this host's glibc (2.36, x86-64) builds it: fdlibm's
float algorithm (sysdeps/ieee754/flt-32/s_tanhf.c, calling s_expm1f.c), every step one float32
operation rounded to nearest, no fma (its disassembly has only addss/subss/mulss/divss and
truncating conversions); and `tanhf_steps`, the same steps on numpy float32 arrays, which
benchmarks/tanhf_exhaustive.py compares with the C library (0 of the 996,147,200 inputs with
2^-55 <= |x| < 22 differ) and the tests on a sample of every branch.
Does not own any device's rendering: CUDA's (codegen/cuda/tanhf.py) and Vulkan's
(codegen/vulkan/tanhf.py) spell the steps for their target from these numbers. ggml's tanh (the
final-logit soft-cap: scale, tanh, scale) calls this function, so a device that reproduces the
reference's softcap must reproduce it.

tanhf(x), |x| = a:
    a >= 22: +-1 (1 - 1e-30 rounded);  a < 2^-55: x * (1 + x);  x = +-0: x
    a >= 1:  t = expm1f(2a);   z = 1 - 2 / (t + 2)
    a < 1:   t = expm1f(-2a);  z = -t / (t + 2);     the result is z with x's sign
expm1f(x) (only as tanhf calls it: -2 <= x < 0 or 2 <= x < 44, so no overflow, no k = 128):
    |x| < 2^-25: x;  x < -27 ln2: -1
    k = 0 when |x| <= ln2/2, +-1 when |x| < 1.5 ln2, else trunc(x / ln2 +- 1/2); with k != 0
    hi = x - k ln2_hi, lo = k ln2_lo, x = hi - lo, c = (hi - x) - lo
    hfx = x/2, hxs = x hfx, r1 = 1 + hxs (Q1 + hxs (Q2 + hxs (Q3 + hxs (Q4 + hxs Q5))))
    t = 3 - r1 hfx, e = hxs ((r1 - t) / (6 - x t))
    k = 0: x - (x e - hxs);  else e = (x (e - c) - c) - hxs, and by k:
    -1: (x - e)/2 - 1/2;  1: -2 (e - (x + 1/2)) if x < -1/4 else 1 + 2 (x - e)
    k <= -2 or k > 56: ((1 - (e - x)) * 2^k) - 1;  k < 23: (1 - 2^-k - (e - x)) * 2^k;
    else (x - (e + 2^-k) + 1) * 2^k   (* 2^k: k added to the exponent field)
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def _f(bits: int) -> np.float32:
    return np.array([bits], np.uint32).view(np.float32)[0]


# the constants as glibc's rodata holds them (float bits)
LN2_HI = 0x3F317180  # 6.9313812256e-01
LN2_LO = 0x3717F7D1  # 9.0580006145e-06
INV_LN2 = 0x3FB8AA3B  # 1.4426950216e+00
Q = (0xBD088889, 0x3AD00D01, 0xB8A670CD, 0x36867E54, 0xB457EDBB)  # Q1..Q5
TINY = 0x0DA24260  # 1e-30
# |x| thresholds, as bits of |x|
TANH_ONE = 0x41B00000  # 22: tanhf is +-1 from here
TANH_TINY = 0x24000000  # 2^-55: tanhf is x (1 + x) below
TANH_LARGE = 0x3F800000  # 1: tanhf's two expm1f forms
EXPM1_SATURATE = 0x4195B844  # 27 ln2: expm1f of a negative x is -1 from here
EXPM1_REDUCE = 0x3EB17218  # ln2/2: no reduction at or below
EXPM1_ONE_STEP = 0x3F851592  # 1.5 ln2: k = +-1 below
EXPM1_TINY = 0x33000000  # 2^-25: expm1f is x below


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, F32).view(np.uint32)


def _times_2k(y: np.ndarray, k: np.ndarray) -> np.ndarray:
    """y with k added to its exponent field (glibc's SET_FLOAT_WORD(y, i + (k << 23)))."""
    return (_bits(y).astype(np.int64) + (k.astype(np.int64) << 23)).astype(np.uint32).view(F32)


def expm1f_steps(x: np.ndarray) -> np.ndarray:
    """glibc's expm1f over x in [-2, 0) or [2, 44), every operation in float32 as its code has it."""
    x = np.asarray(x, F32)
    hx, neg = _bits(x) & 0x7FFFFFFF, x < 0
    one_step = hx < EXPM1_ONE_STEP
    kf = (_f(INV_LN2) * x + np.where(neg, F32(-0.5), F32(0.5))).astype(F32)
    k = np.where(one_step, np.where(neg, -1, 1), np.trunc(kf)).astype(np.int32)
    k = np.where(hx > EXPM1_REDUCE, k, 0)
    t = k.astype(F32)
    hi = np.where(one_step, np.where(neg, x + _f(LN2_HI), x - _f(LN2_HI)), x - t * _f(LN2_HI)).astype(F32)
    lo = np.where(one_step, np.where(neg, -_f(LN2_LO), _f(LN2_LO)), t * _f(LN2_LO)).astype(F32)
    r = np.where(k != 0, hi - lo, x).astype(F32)
    c = np.where(k != 0, (hi - r) - lo, F32(0)).astype(F32)
    hfx = (F32(0.5) * r).astype(F32)
    hxs = (r * hfx).astype(F32)
    q1, q2, q3, q4, q5 = (_f(b) for b in Q)
    r1 = F32(1) + hxs * (q1 + hxs * (q2 + hxs * (q3 + hxs * (q4 + hxs * q5))))
    tt = (F32(3) - r1 * hfx).astype(F32)
    e = (hxs * ((r1 - tt) / (F32(6) - r * tt))).astype(F32)
    k0 = r - (r * e - hxs)
    e = ((r * (e - c) - c) - hxs).astype(F32)
    minus1 = F32(0.5) * (r - e) - F32(0.5)
    plus1 = np.where(r < F32(-0.25), F32(-2) * (e - (r + F32(0.5))), F32(1) + F32(2) * (r - e))
    far = _times_2k((F32(1) - (e - r)).astype(F32), k) - F32(1)
    two_k = np.clip(k, 0, 126)
    low_t = (np.uint32(0x3F800000) - (np.uint32(0x1000000) >> two_k.astype(np.uint32))).view(F32)
    near = _times_2k((low_t - (e - r)).astype(F32), k)
    high_t = ((0x7F - two_k).astype(np.uint32) << 23).view(F32)
    mid = _times_2k(((r - (e + high_t)) + F32(1)).astype(F32), k)
    y = np.select([k == 0, k == -1, k == 1, (k <= -2) | (k > 56), k < 23], [k0, minus1, plus1, far, near], mid)
    y = np.where(neg & (hx >= EXPM1_SATURATE), _f(TINY) - F32(1), y)
    return np.where(hx < EXPM1_TINY, x, y).astype(F32)


def tanhf_steps(x: np.ndarray) -> np.ndarray:
    """glibc's tanhf of every value of x, every operation in float32 as its code has it."""
    x = np.asarray(x, F32)
    with np.errstate(all="ignore"):
        hx = _bits(x) & 0x7FFFFFFF
        a = np.abs(x)
        large = hx >= TANH_LARGE
        t = expm1f_steps(np.where(large, a + a, F32(-2) * a))
        z = np.where(large, F32(1) - F32(2) / (t + F32(2)), -t / (t + F32(2))).astype(F32)
        z = np.where(hx >= TANH_ONE, F32(1) - _f(TINY), z)
        z = np.where(x < 0, -z, z)
        z = np.where(hx < TANH_TINY, x * (F32(1) + x), z)
        z = np.where(hx == 0, x, z)
        special = np.where(x < 0, F32(1) / x - F32(1), F32(1) / x + F32(1))  # +-inf -> +-1, NaN -> NaN
        return np.where(hx >= 0x7F800000, special, z).astype(F32)
