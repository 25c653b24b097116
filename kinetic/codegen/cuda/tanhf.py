"""The C library's tanhf in the prelude's language: `k_tanhf_libc`, for the soft-cap kernel.

Owns: the CUDA C text of glibc's tanhf and the expm1f it calls (fdlibm's float algorithm), each
float operation a `k_*` call, so that it rounds once and is never contracted into an fma, on the GPU
and in the host emulation alike. Does not own the algorithm's constants or its statement
(codegen/common/tanhf.py, whose `tanhf_steps` follows the same steps and is checked against the C
library by benchmarks/tanhf_exhaustive.py on every input that reaches expm1f).
"""

from __future__ import annotations

from kinetic.codegen.common import tanhf as t


def _bits(b: int) -> str:
    return f"k_bits2f(0x{b:08X}u)"


def libc_tanhf() -> str:
    """The text of k_expm1f_libc (for tanhf's arguments only) and k_tanhf_libc."""
    q1, q2, q3, q4, q5 = (_bits(b) for b in t.Q)
    return f"""
// ---- the C library's tanhf (glibc: fdlibm's s_tanhf.c and s_expm1f.c), float steps in its order ----
// expm1f as tanhf calls it: -2 <= x < 0 or 2 <= x < 44 (no overflow, k < 128)
DEV float k_expm1f_libc(float x) {{
    const u32 hx = k_f2bits(x) & 0x7fffffffu;
    const bool neg = (k_f2bits(x) >> 31) != 0;
    if (hx < 0x{t.EXPM1_TINY:08X}u) return x;
    if (neg && hx >= 0x{t.EXPM1_SATURATE:08X}u) return k_sub({_bits(t.TINY)}, 1.0f);
    int k = 0;
    float c = 0.0f;
    if (hx > 0x{t.EXPM1_REDUCE:08X}u) {{
        float hi, lo;
        if (hx < 0x{t.EXPM1_ONE_STEP:08X}u) {{
            hi = neg ? k_add(x, {_bits(t.LN2_HI)}) : k_sub(x, {_bits(t.LN2_HI)});
            lo = neg ? -{_bits(t.LN2_LO)} : {_bits(t.LN2_LO)};
            k = neg ? -1 : 1;
        }} else {{
            k = (int)k_add(k_mul({_bits(t.INV_LN2)}, x), neg ? -0.5f : 0.5f);  // truncated
            const float kf = k_i2f(k);
            hi = k_sub(x, k_mul(kf, {_bits(t.LN2_HI)}));
            lo = k_mul(kf, {_bits(t.LN2_LO)});
        }}
        x = k_sub(hi, lo);
        c = k_sub(k_sub(hi, x), lo);
    }}
    const float hfx = k_mul(0.5f, x), hxs = k_mul(x, hfx);
    const float r1 = k_add(1.0f, k_mul(hxs, k_add({q1}, k_mul(hxs, k_add({q2}, k_mul(hxs, k_add({q3},
                         k_mul(hxs, k_add({q4}, k_mul(hxs, {q5}))))))))));
    const float tt = k_sub(3.0f, k_mul(r1, hfx));
    float e = k_mul(hxs, k_div(k_sub(r1, tt), k_sub(6.0f, k_mul(x, tt))));
    if (k == 0) return k_sub(x, k_sub(k_mul(x, e), hxs));
    e = k_sub(k_sub(k_mul(x, k_sub(e, c)), c), hxs);
    if (k == -1) return k_sub(k_mul(0.5f, k_sub(x, e)), 0.5f);
    if (k == 1) return x < -0.25f ? k_mul(-2.0f, k_sub(e, k_add(x, 0.5f))) : k_add(1.0f, k_mul(2.0f, k_sub(x, e)));
    if (k <= -2 || k > 56) return k_sub(k_bits2f(k_f2bits(k_sub(1.0f, k_sub(e, x))) + ((u32)k << 23)), 1.0f);
    if (k < 23) {{
        const float one_less = k_bits2f(0x3f800000u - (0x1000000u >> k));  // 1 - 2^-k
        return k_bits2f(k_f2bits(k_sub(one_less, k_sub(e, x))) + ((u32)k << 23));
    }}
    const float y = k_add(k_sub(x, k_add(e, k_bits2f((u32)(0x7f - k) << 23))), 1.0f);
    return k_bits2f(k_f2bits(y) + ((u32)k << 23));
}}
DEV float k_tanhf_libc(float x) {{
    const u32 hx = k_f2bits(x) & 0x7fffffffu;
    const bool neg = (k_f2bits(x) >> 31) != 0;
    if (hx >= 0x7f800000u) return neg ? k_sub(k_div(1.0f, x), 1.0f) : k_add(k_div(1.0f, x), 1.0f);
    if (hx == 0u) return x;
    if (hx < 0x{t.TANH_TINY:08X}u) return k_mul(x, k_add(1.0f, x));
    const float a = k_abs(x);
    float z;
    if (hx >= 0x{t.TANH_ONE:08X}u) {{
        z = k_sub(1.0f, {_bits(t.TINY)});
    }} else if (hx >= 0x{t.TANH_LARGE:08X}u) {{
        const float e = k_expm1f_libc(k_add(a, a));
        z = k_sub(1.0f, k_div(2.0f, k_add(e, 2.0f)));
    }} else {{
        const float e = k_expm1f_libc(k_mul(a, -2.0f));
        z = k_div(-e, k_add(e, 2.0f));
    }}
    return neg ? -z : z;
}}
"""
