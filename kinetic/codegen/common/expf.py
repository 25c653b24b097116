"""glibc's expf as data: the table and constants every device's bit-identical expf evaluates.

Owns: the constants of glibc's `__expf` (sysdeps/ieee754/flt-32/e_expf.c, from ARM's
optimized-routines), spelled as the bits of their double values, and the thresholds of its special
cases. Does not own any rendering of the algorithm: the CPU's vector kernel (codegen/cpu/expf_ir.py,
which also holds the proof and the guard), CUDA's (codegen/cuda/prelude.py) and Vulkan's
(codegen/vulkan/attention.py) each spell it for their target from these numbers.

The algorithm, evaluated in double precision:

    z = x * 32/ln2;  k = round(z) (ties to even, through the shift 0x1.8p52);  r = z - k
    expf(x) = 2^(k/32) * 2^(r/32) ~= s * (C0 r^3 + C1 r^2 + C2 r + 1),   s = 2^((k mod 32)/32) * 2^(k div 32)

with s put together from the 32-entry `TABLE` plus k shifted into the exponent field, and the result
rounded once to float.
"""

from __future__ import annotations

# tab[i] = bits(2^(i/32) rounded to double) - (i << 47): glibc's __exp2f_data.tab
# (sysdeps/ieee754/flt-32/e_exp2f_data.c, ARM optimized-routines), identical to the table in this
# host's libm.so.6; tests/codegen/cpu/test_cpu_expf.py recomputes it from its definition.
TABLE = (
    0x3FF0000000000000, 0x3FEFD9B0D3158574, 0x3FEFB5586CF9890F, 0x3FEF9301D0125B51,
    0x3FEF72B83C7D517B, 0x3FEF54873168B9AA, 0x3FEF387A6E756238, 0x3FEF1E9DF51FDEE1,
    0x3FEF06FE0A31B715, 0x3FEEF1A7373AA9CB, 0x3FEEDEA64C123422, 0x3FEECE086061892D,
    0x3FEEBFDAD5362A27, 0x3FEEB42B569D4F82, 0x3FEEAB07DD485429, 0x3FEEA47EB03A5585,
    0x3FEEA09E667F3BCD, 0x3FEE9F75E8EC5F74, 0x3FEEA11473EB0187, 0x3FEEA589994CCE13,
    0x3FEEACE5422AA0DB, 0x3FEEB737B0CDC5E5, 0x3FEEC49182A3F090, 0x3FEED503B23E255D,
    0x3FEEE89F995AD3AD, 0x3FEEFF76F2FB5E47, 0x3FEF199BDD85529C, 0x3FEF3720DCEF9069,
    0x3FEF5818DCFBA487, 0x3FEF7C97337B9B5F, 0x3FEFA4AFA2A490DA, 0x3FEFD0765B6E4540,
)
# glibc's constants (same source; the polynomial is 2^(r/32) - 1 with r in [-1/2, 1/2]), as the
# hex of their double values, the spelling LLVM and C read exactly
INV_LN2_N = "0x40471547652B82FE"  # 0x1.71547652b82fep+0 * 32
SHIFT = "0x4338000000000000"  # 0x1.8p52: adding it rounds to an integer held in the low bits
POLY = ("0x3EBC6AF84B912394", "0x3F2EBFCE50FAC4F3", "0x3F962E42FF0C52D6")  # C0, C1, C2: /32^3, /32^2, /32
# the float thresholds of glibc's special cases
OVERFLOW = float.fromhex("0x1.62e42ep6")  # above: inf
UNDERFLOW = float.fromhex("-0x1.9fe368p6")  # below: 0
MAY_UNDERFLOW = float.fromhex("-0x1.9d1d9ep6")  # below: the smallest subnormal
# the only inputs (of all 2^32) where glibc's SSE2 build (z = x * InvLn2N rounded before the shift)
# gives other bits than its FMA build: 32.564632 and -63.09946 (benchmarks/expf_exhaustive.py --sse2,
# confirmed against that build's code in this host's libm)
SSE2_DIFFERS = (0x4202422F, 0xC27C65D9)
