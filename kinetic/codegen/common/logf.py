"""The C library's logf constants (glibc's `__logf_data`, sysdeps/ieee754/flt-32/e_logf.c), which the
device kernels' softplus evaluates (Vulkan: kinetic/codegen/vulkan/logf.py; CUDA:
kinetic/codegen/cuda/logf.py).

Owns: the 16 (1/c, log c) pairs of the table, ln 2 and the polynomial, each as the bits of its double
(read from this host's libm.so.6: the table sits just before ln 2's bits), and the algorithm's
integer constants. Does not own any device's code.

The algorithm, in double precision: x = 2^k z with z in [0x1.66p-1, 0x1.66p0); i, the top 4 bits of
z's mantissa after an offset, picks c ~ z; log x = log1p(z/c - 1) + log c + k ln 2, with r = z * (1/c)
- 1 (one fma), log1p(r) ~ r + A2 r^2 + A1 r^3 + A0 r^4 in the pipelined order glibc writes, every
multiply-add an fma as GCC contracts them (x86-64 FMA build), and the sum rounded once to float.
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
OFF = 0x3F330000  # ix - OFF: the table index in bits 19..22, k in the top bits (arithmetic shift)
