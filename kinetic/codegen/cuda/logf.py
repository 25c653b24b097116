"""The C library's logf as CUDA C (`k_logf_libc`), for the softplus of the recurrent kernels.

Owns: glibc's `__logf` (sysdeps/ieee754/flt-32/e_logf.c, from ARM's optimized-routines) with the
operations its x86-64 FMA build fuses, as CUDA C; its constants (`__logf_data`: 16 (1/c, log c)
pairs, ln 2, the polynomial and the index offset) are kinetic/codegen/common/logf.py's, the bits
Vulkan's kernels use too. The test compares the function with the C library's logf on every
input of [1, 2) and a sample of the rest (tests/codegen/cuda/test_cuda_recurrent.py). Does not own
softplus itself (numerics.recurrent.softplus is the meaning; the kernels call this).

The algorithm, in double precision: x = 2^k z with z in [0x1.66p-1, 0x1.66p0); i, the top 4 bits of
z's mantissa after an offset, picks c ~ z; log x = log1p(z/c - 1) + log c + k ln 2, with r = z * (1/c)
- 1 (one fma), log1p(r) ~ r + A2 r^2 + A1 r^3 + A0 r^4 in the pipelined order glibc writes, every
multiply-add an fma as GCC contracts them, and the sum rounded once to float.
"""

from __future__ import annotations

from kinetic.codegen.common.logf import LN2, OFF, POLY, TABLE


def libc_logf() -> str:
    """The device function's text (after the prelude, which defines the k_* arithmetic)."""
    inv = ", ".join(f"0x{a:016X}ull" for a, _ in TABLE)
    logc = ", ".join(f"0x{b:016X}ull" for _, b in TABLE)
    a0, a1, a2 = (f"k_bits2d(0x{c:016X}ull)" for c in POLY)
    return f"""
// ---- the C library's logf (glibc, FMA build), in double precision as glibc evaluates it ----
KCONST u64 k_logf_invc[16] = {{{inv}}};
KCONST u64 k_logf_logc[16] = {{{logc}}};
DEV float k_logf_libc(float x) {{
    u32 ix = k_f2bits(x);
    if (ix == 0x3f800000u) return 0.0f;
    if (ix - 0x00800000u >= 0x7f800000u - 0x00800000u) {{
        if (ix * 2u == 0u) return k_bits2f(0xff800000u);            // log(+-0) = -inf
        if (ix == 0x7f800000u) return x;                              // log(inf) = inf
        if ((ix & 0x80000000u) || ix * 2u >= 0xff000000u)            // NaN, or x < 0: glibc's
            return k_div(k_sub(x, x), k_sub(x, x));                   // (x - x) / (x - x)
        ix = k_f2bits(k_mul(x, 0x1p23f)) - (23u << 23);               // a subnormal, normalized
    }}
    const u32 tmp = ix - 0x{OFF:08x}u;
    const int i = (int)((tmp >> 19) % 16u);
    const int k = (int)tmp >> 23;
    const u32 iz = ix - (tmp & 0xff800000u);
    const double invc = k_bits2d(k_logf_invc[i]), logc = k_bits2d(k_logf_logc[i]);
    const double z = (double)k_bits2f(iz);
    const double r = k_dfma(z, invc, -1.0);
    const double y0 = k_dfma((double)k, k_bits2d(0x{LN2:016X}ull), logc);
    const double r2 = k_dmul(r, r);
    double y = k_dfma({a1}, r, {a2});
    y = k_dfma({a0}, r2, y);
    y = k_dfma(y, r2, k_dadd(y0, r));
    return k_d2f(y);
}}
"""
