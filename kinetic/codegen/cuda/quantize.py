"""The activation quantizers the quantized matmuls read, as CUDA C: a row of f32 values to 8-bit
values and scales in the format the weight type's dot product takes (Q8_0, Q8_1 with block sums,
Q8_K per 256), each specialized to its width.

Owns: the quantizer kernels. Does not own: which format a weight type takes (gemv.activation_format)
or the meaning (kinetic/ir/numerics/activations.py: quantize_q8_0, q8_1_sums, quantize_q8_k), which they follow
bit for bit: the scale is the block's largest magnitude found by an order-free butterfly, each value
rounded once, the sums exact integer sums.
"""

from __future__ import annotations

from kinetic.codegen.cuda.kernel import Kernel, Param, butterfly, indent, int_sum

QUANTIZE_WARPS = 8  # warps per block of the activation quantizers (one block of values per warp)


def quantize(fmt: str, k: int) -> Kernel:
    """f32 x [rows, k] -> int8 xq [rows, k], f32 xd [rows, k/block] (and Q8_1's xs [rows, k/32])."""
    if fmt in ("q8_0", "q8_1"):
        return _quantize_q8_0(k, fmt == "q8_1")
    if fmt == "q8_k":
        return _quantize_q8_k(k)
    raise ValueError(f"unknown activation format {fmt!r}")


def _quantize_q8_0(k: int, with_sums: bool) -> Kernel:
    """numerics.quantize_q8_0 (and q8_1_sums): one warp per block of 32, lane i holding value i;
    amax by a max butterfly (exact in any order), d = amax/127 rounded to f16, q = rint(x * 127/amax)."""
    if k % 32:
        raise ValueError(f"Q8_0 activations need a width that is a multiple of 32, not {k}")
    nb = k // 32
    params = [Param("x", "const float*"), Param("xq", "i8*"), Param("xd", "float*")]
    sums_decl = sum_reduce = sums_store = ""
    if with_sums:
        params.append(Param("xs", "float*"))
        sums_decl = "  LANE(int, isum);\n  LANE(int, itmp);\n"
        sum_reduce = indent(int_sum("isum", (16, 8, 4, 2, 1)), 0) + "\n"
        # s = f16(d * sum q) with d unrounded
        sums_store = ("    LANES { if (LANE_ID == 0) ST(float, xs, (long)BY * NB + b,\n"
                      "        k_h2f(k_f2h(k_mul(k_div(L(amax), 127.0f), k_i2f(L(isum)))))); }\n")
    body = f"""\
  LANE(float, v);
  LANE(float, amax);
  LANE(float, other);
{sums_decl}  enum {{ NB = {nb}, K = {k} }};
BODY
  const int b = BX * {QUANTIZE_WARPS} + WARP;
  if (b < NB) {{
    LANES {{ L(v) = LD(float, x, (long)BY * K + 32 * b + LANE_ID); L(amax) = k_abs(L(v)); }}
{butterfly("amax", "k_max(L(amax), L(other))", (16, 8, 4, 2, 1), 4)}

    LANES {{
      const float inv = L(amax) != 0.0f ? k_div(127.0f, L(amax)) : 0.0f;
      const int q = k_rint(k_mul(L(v), inv));
      ST(i8, xq, (long)BY * K + 32 * b + LANE_ID, (i8)q);
      if (LANE_ID == 0) ST(float, xd, (long)BY * NB + b, k_h2f(k_f2h(k_div(L(amax), 127.0f))));
      {"L(isum) = q;" if with_sums else ""}
    }}
{sum_reduce}{sums_store}  }}
"""
    name = f"quantize_{'q8_1' if with_sums else 'q8_0'}_k{k}"
    return Kernel(name, "quantize", 32 * QUANTIZE_WARPS, -(-nb // QUANTIZE_WARPS), tuple(params), body)


def _quantize_q8_k(k: int) -> Kernel:
    """numerics.quantize_q8_k: one warp per super-block of 256, lane i holding values 8i..8i+7. The
    signed value of largest magnitude, the first one on ties, by a butterfly on (|v|, index): exact
    and order-free. iscale = -127/max, q = min(127, rint(iscale * x)), d = 1/iscale."""
    if k % 256:
        raise ValueError(f"Q8_K activations need a width that is a multiple of 256, not {k}")
    nb = k // 256
    params = (Param("x", "const float*"), Param("xq", "i8*"), Param("xd", "float*"))
    reduce = "".join(f"""\
    SHFL_XOR(omag, mag, {m}); SHFL_XOR(oidx, idx, {m}); SHFL_XOR(oval, val, {m});
    LANES {{
      if (L(omag) > L(mag) || (L(omag) == L(mag) && L(oidx) < L(idx))) {{
        L(mag) = L(omag); L(idx) = L(oidx); L(val) = L(oval);
      }}
    }}
""" for m in (16, 8, 4, 2, 1))
    body = f"""\
  LANE(float, mag);
  LANE(int, idx);
  LANE(float, val);
  LANE(float, omag);
  LANE(int, oidx);
  LANE(float, oval);
  enum {{ NB = {nb}, K = {k} }};
BODY
  const int b = BX * {QUANTIZE_WARPS} + WARP;
  if (b < NB) {{
    LANES {{
      L(mag) = -1.0f;
      for (int i = 0; i < 8; ++i) {{
        const float v = LD(float, x, (long)BY * K + 256 * b + 8 * LANE_ID + i);
        if (k_abs(v) > L(mag)) {{ L(mag) = k_abs(v); L(idx) = 8 * LANE_ID + i; L(val) = v; }}
      }}
    }}
{reduce}    LANES {{
      const float iscale = L(val) != 0.0f ? k_div(-127.0f, L(val)) : 0.0f;
      for (int i = 0; i < 8; ++i) {{
        const long at = (long)BY * K + 256 * b + 8 * LANE_ID + i;
        const int q = k_rint(k_mul(LD(float, x, at), iscale));
        ST(i8, xq, at, (i8)(q < 127 ? q : 127));
      }}
      if (LANE_ID == 0) ST(float, xd, (long)BY * NB + b, L(val) != 0.0f ? k_div(1.0f, iscale) : 0.0f);
    }}
  }}
"""
    return Kernel(f"quantize_q8_k_k{k}", "quantize", 32 * QUANTIZE_WARPS, -(-nb // QUANTIZE_WARPS), params, body)
