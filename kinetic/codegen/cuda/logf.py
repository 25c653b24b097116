"""The C library's logf as CUDA C (`k_logf_libc`), for the softplus of the recurrent kernels.

Owns: glibc's `__logf` (sysdeps/ieee754/flt-32/e_logf.c, from ARM's optimized-routines) with the
operations its x86-64 FMA build fuses, and its constants (`__logf_data`: 16 (1/c, log c) pairs, ln 2
and the polynomial), spelled as the bits of their doubles, read from this host's libm.so.6 (the table
sits just before ln 2's bits). The test compares the function with the C library's logf on every
input of [1, 2) and a sample of the rest (tests/codegen/cuda/test_cuda_recurrent.py). Does not own
softplus itself (numerics.recurrent.softplus is the meaning; the kernels call this).

The algorithm, in double precision: x = 2^k z with z in [0x1.66p-1, 0x1.66p0); i, the top 4 bits of
z's mantissa after an offset, picks c ~ z; log x = log1p(z/c - 1) + log c + k ln 2, with r = z * (1/c)
- 1 (one fma), log1p(r) ~ r + A2 r^2 + A1 r^3 + A0 r^4 in the pipelined order glibc writes, every
multiply-add an fma as GCC contracts them, and the sum rounded once to float.
"""

from __future__ import annotations

# (1/c, log c) per table slot: glibc's __logf_data.tab
TABLE = (
    (0x3FF661EC79F8F3BE, 0xBFD57BF7808CAADE), (0x3FF571ED4AAF883D, 0xBFD2BEF0A7C06DDB),
    (0x3FF49539F0F010B0, 0xBFD01EAE7F513A67), (0x3FF3C995B0B80385, 0xBFCB31D8A68224E9),
    (0x3FF30D190C8864A5, 0xBFC6574F0AC07758), (0x3FF25E227B0B8EA0, 0xBFC1AA2BC79C8100),
    (0x3FF1BB4A4A1A343F, 0xBFBA4E76CE8C0E5E), (0x3FF12358F08AE5BA, 0xBFB1973C5A611CCC),
    (0x3FF0953F419900A7, 0xBFA252F438E10C1E), (0x3FF0000000000000, 0x0000000000000000),
    (0x3FEE608CFD9A47AC, 0x3FAAA5AA5DF25984), (0x3FECA4B31F026AA0, 0x3FBC5E53AA362EB4),
    (0x3FEB2036576AFCE6, 0x3FC526E57720DB08), (0x3FE9C2D163A1AA2D, 0x3FCBC2860D224770),
    (0x3FE886E6037841ED, 0x3FD1058BC8A07EE1), (0x3FE767DCF5534862, 0x3FD4043057B6EE09),
)
LN2 = 0x3FE62E42FEFA39EF
POLY = (0xBFD00EA348B88334, 0x3FD5575B0BE00B6A, 0xBFDFFFFEF20A4123)  # A0 (r^4), A1 (r^3), A2 (r^2)


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
    const u32 tmp = ix - 0x3f330000u;
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
