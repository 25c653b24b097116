"""Quantized matrix-vector kernels and the activation quantizers they read, as CUDA C.

Owns: one GEMV kernel per weight format (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K) and the kernels
that quantize an activation row first (Q8_0, Q8_1 per 32 values, Q8_K per 256), each specialized to
its shape. Does not own: the meaning (kinetic/ir/numerics.py) or compiling and launching.

Every kernel sums in exactly the reference's order (numerics.matmul, which is ggml's x86 order for a
decode row), so a GPU, the host emulation and the reference interpreter agree bit for bit:

* block-32 formats (numerics._lane_dot): 8 float lanes per output, lane l holding values 4l..4l+3 of
  every block. Here 8 threads per output, thread l one lane: per block the exact integer dot of its
  4 values (one dp4a) and `acc = fma(d_w * d_x, f32(dot), acc)`, blocks in order; then the 8 lanes
  summed as ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)), which is a butterfly over the lane bits, shuffles
  with lane ^ 4, ^ 2, ^ 1 (float addition is commutative, so both partners get the same sum). Q8_1
  formats add the sum over blocks of m_w * s_x, in block order, at the end.
* Q4_K (numerics._superblock_dot, ggml's repacked gemv): one warp per output; per super-block the
  exact integer sums iacc = sum sc*q*q_x and imin = sum m*bsum32(q_x) over the warp (integer
  shuffles: exact in any order), then one float chain acc = fma(f32(iacc), d_w*d_x, acc),
  accmin likewise, result acc - accmin.
* Q6_K (ggml_vec_dot_q6_K_q8_K): one warp per output, 8 float lanes; thread (p, l) adds the integer
  part of lane l over chunks 2p, 2p+1 and its quarter of the -32 offset, the four quarters are summed
  exactly by shuffles, each lane chain acc_l = fma(d_x*d_w, f32(lane_l), acc_l) runs over the
  super-blocks in order, and the 8 lanes end in the same butterfly as above.

Activations: grid y is the row, so rows never mix, and a batch gives every row what it gets alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cuda.kernel import Kernel, Param
from kinetic.ir import numerics, quant_dots

GEMV_WARPS = 4  # warps per block of every GEMV kernel
QUANTIZE_WARPS = 8  # warps per block of the activation quantizers (one block of values per warp)


@dataclass(frozen=True)
class Block32Format:
    """A block-32 weight layout: its bytes per block, activation format and per-lane decoding.

    `lane` is C code that, given `blk` (the block's first byte) and `l` (the lane 0..7), defines
    `wv`: the 4 signed 8-bit weights of values 4l..4l+3 packed in an int, as dp4a takes them."""

    block_bytes: int
    activations: str  # "q8_0" or "q8_1" (then the f16 minimum m sits at byte 2)
    lane: str


# nibble j < 16 of a block is the low half of byte j, nibble 16 + j the high half: lane l < 4 reads
# the low halves of bytes 4l..4l+3, lane l >= 4 the high halves of bytes 4(l-4)..
_NIBBLES = "((l < 4 ? qs : qs >> 4) & 0x0f0f0f0fu)"
# bit 4l + i of qh moved to bit 4 of byte i (the fifth bit of values 4l..4l+3)
_HIGH_BITS = "const u32 hb = ((qh & 1u) << 4) | ((qh & 2u) << 11) | ((qh & 4u) << 18) | ((qh & 8u) << 25);"

BLOCK32: dict[Q, Block32Format] = {
    Q.Q8_0: Block32Format(34, "q8_0", "const int wv = (int)k_ld_u16x2(blk, 2 + 4 * l);"),
    # bytes + 0x78 then ^ 0x80: each nibble minus 8 as a signed byte, no carry between bytes
    Q.Q4_0: Block32Format(18, "q8_0", f"const u32 qs = k_ld_u16x2(blk, 2 + 4 * (l & 3));\n"
                                      f"const int wv = (int)(({_NIBBLES} + 0x78787878u) ^ 0x80808080u);"),
    Q.Q4_1: Block32Format(20, "q8_1", f"const u32 qs = LDB(u32, blk, 4 + 4 * (l & 3));\n"
                                      f"const int wv = (int){_NIBBLES};"),
    Q.Q5_0: Block32Format(22, "q8_0", f"const u32 qs = k_ld_u16x2(blk, 6 + 4 * (l & 3));\n"
                                      f"const u32 qh = k_ld_u16x2(blk, 2) >> (4 * l);\n{_HIGH_BITS}\n"
                                      f"const int wv = (int)((({_NIBBLES} | hb) + 0x70707070u) ^ 0x80808080u);"),
    Q.Q5_1: Block32Format(24, "q8_1", f"const u32 qs = LDB(u32, blk, 8 + 4 * (l & 3));\n"
                                      f"const u32 qh = LDB(u32, blk, 4) >> (4 * l);\n{_HIGH_BITS}\n"
                                      f"const int wv = (int)({_NIBBLES} | hb);"),
}
SUPERBLOCK = {Q.Q4_K: 144, Q.Q6_K: 210}  # bytes per super-block of 256 values
SUPPORTED = frozenset(BLOCK32) | frozenset(SUPERBLOCK)


def activation_format(wtype: Q) -> str:
    """The 8-bit format a row takes before a GEMV with this weight type (numerics.activation_format)."""
    if wtype in BLOCK32:
        return BLOCK32[wtype].activations
    if wtype in SUPERBLOCK:
        return "q8_k"
    raise NotImplementedError(f"no CUDA GEMV for {wtype.name}")


def _indent(code: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line if line else line for line in code.splitlines())


# ---- activation quantizers --------------------------------------------------------------------------


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
        sum_reduce = _indent(_int_sum("isum", (16, 8, 4, 2, 1)), 0) + "\n"
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
{_butterfly("amax", "k_max(L(amax), L(other))", (16, 8, 4, 2, 1), 4)}

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


# ---- GEMV ---------------------------------------------------------------------------------------------


def gemv(wtype: Q, n_out: int, k: int) -> Kernel:
    """y [rows, n_out] = x [rows, k] times weight [n_out, k] transposed, x given quantized (quantize())."""
    if wtype in BLOCK32:
        return _gemv_block32(wtype, n_out, k)
    if wtype is Q.Q4_K:
        return _gemv_q4_k(n_out, k)
    if wtype is Q.Q6_K:
        return _gemv_q6_k(n_out, k)
    raise NotImplementedError(f"no CUDA GEMV for {wtype.name}")


def _gemv_params(with_sums: bool) -> tuple[Param, ...]:
    params = [Param("w", "const u8*"), Param("xq", "const i8*"), Param("xd", "const float*")]
    if with_sums:
        params.append(Param("xs", "const float*"))
    return (*params, Param("y", "float*"))


# ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)) over the lane bits of LANE_ID & 7
_HSUM8 = "".join(f"  SHFL_XOR(other, acc, {m}); LANES {{ L(acc) = k_add(L(acc), L(other)); }}\n" for m in (4, 2, 1))


def block32_order(wtype: Q) -> str:
    """How the reference sums a block-32 type: "lanes" (numerics.LANE_TYPES, ggml's vec-dots: 8 float
    lanes) or "scalar" (quant_dots.SCALAR_ORDER, llama.cpp's repacked gemv: one float chain of whole
    block dots). Read from the reference's own tables, so a kernel follows it when it changes."""
    if wtype in numerics.LANE_TYPES:
        return "lanes"
    if wtype in quant_dots.SCALAR_ORDER:
        return "scalar"
    raise NotImplementedError(f"the reference sums {wtype.name} in neither block-32 order")


def _gemv_block32(wtype: Q, n_out: int, k: int) -> Kernel:
    """8 threads per output, thread l holding values 4l..4l+3 of every block. "lanes": each thread
    one float lane, the butterfly at the end. "scalar": the 8 integer parts summed by an integer
    butterfly per block (exact), then one float chain acc = fma(f32(dot), d_x*d_w, acc) that the 8
    threads run alike."""
    fmt = BLOCK32[wtype]
    if k % 32:
        raise ValueError(f"{wtype.name} rows must be a multiple of 32 values, not {k}")
    nb, q8_1, scalar = k // 32, fmt.activations == "q8_1", block32_order(wtype) == "scalar"
    if scalar and q8_1:
        raise NotImplementedError(f"{wtype.name}: the scalar order has no Q8_1 minimum term here")
    per_block = 4 * GEMV_WARPS  # outputs: 4 per warp, 8 threads each
    summs = "        L(summs) = k_add(L(summs), k_mul(k_h2f(LDB(u16, blk, 2)), LD(float, xs, (long)BY * NB + b)));\n"
    if scalar:
        step = f"""\
        L(part) = k_dp4a(wv, LD(int, xq, ((long)BY * K + 32 * b) / 4 + l), 0);
      }}
    }}
{"".join(f"    SHFL_XOR(itmp, part, {m}); LANES {{ L(part) += L(itmp); }}{chr(10)}" for m in (4, 2, 1))}\
    LANES {{
      if (L(n) < N) {{
        const u8* blk = w + ((long)L(n) * NB + b) * BLOCK_BYTES;
        const float dx = LD(float, xd, (long)BY * NB + b);
        L(acc) = k_fma(k_i2f(L(part)), k_mul(dx, k_h2f(LDB(u16, blk, 0))), L(acc));
"""
        declare, finish = "  LANE(int, part);\n  LANE(int, itmp);\n", ""
    else:
        step = """\
        const int xv = LD(int, xq, ((long)BY * K + 32 * b) / 4 + l);
        const float dx = LD(float, xd, (long)BY * NB + b);
        L(acc) = k_fma(k_mul(k_h2f(LDB(u16, blk, 0)), dx), k_i2f(k_dp4a(wv, xv, 0)), L(acc));
""" + (summs if q8_1 else "")
        declare, finish = ("  LANE(float, summs);\n" if q8_1 else ""), _HSUM8
    result = "k_add(L(acc), L(summs))" if q8_1 else "L(acc)"
    body = f"""\
  LANE(int, n);
  LANE(float, acc);
  LANE(float, other);
{declare}\
  enum {{ N = {n_out}, K = {k}, NB = {nb}, BLOCK_BYTES = {fmt.block_bytes} }};
BODY
  LANES {{
    L(n) = (BX * {GEMV_WARPS} + WARP) * 4 + (LANE_ID >> 3);
    L(acc) = 0.0f;
    {"L(summs) = 0.0f;" if q8_1 else ""}
  }}
  for (int b = 0; b < NB; ++b) {{
    LANES {{
      {"L(part) = 0;" if scalar else ""}
      if (L(n) < N) {{
        const int l = LANE_ID & 7;
        const u8* blk = w + ((long)L(n) * NB + b) * BLOCK_BYTES;
{_indent(fmt.lane, 8)}
{step}\
      }}
    }}
  }}
{finish}\
  LANES {{
    if (L(n) < N && (LANE_ID & 7) == 0) ST(float, y, (long)BY * N + L(n), {result});
  }}
"""
    name = f"gemv_{wtype.name.lower()}_n{n_out}_k{k}"
    return Kernel(name, "gemv", 32 * GEMV_WARPS, -(-n_out // per_block), _gemv_params(q8_1), body)


def _butterfly(var: str, combine: str, masks: tuple[int, ...], indent: int, other: str = "other") -> str:
    """Shuffle `var` with lane ^ m into `other` and combine, for each mask in order (uniform code)."""
    steps = (f"SHFL_XOR({other}, {var}, {m}); LANES {{ L({var}) = {combine}; }}" for m in masks)
    return "\n".join(" " * indent + s for s in steps)


def _int_sum(var: str, masks: tuple[int, ...]) -> str:
    return _butterfly(var, f"L({var}) + L(itmp)", masks, 4, other="itmp") + "\n"


def _gemv_q4_k(n_out: int, k: int) -> Kernel:
    """Thread t of the warp: group g = t >> 3 of 64 values, bytes 4j..4j+3 (j = t & 7) of its 32 qs
    bytes, whose low nibbles are values 64g+4j.. (sub-block 2g), high nibbles 64g+32+4j.. (2g+1)."""
    if k % 256:
        raise ValueError(f"Q4_K rows must be a multiple of 256 values, not {k}")
    body = f"""\
  LANE(int, iacc);
  LANE(int, imin);
  LANE(int, itmp);
  LANE(float, acc);
  LANE(float, accmin);
  enum {{ N = {n_out}, K = {k}, NSB = {k // 256} }};
BODY
  const int n = BX * {GEMV_WARPS} + WARP;
  if (n < N) {{
    LANES {{ L(acc) = 0.0f; L(accmin) = 0.0f; }}
    for (int b = 0; b < NSB; ++b) {{
      LANES {{
        const int g = LANE_ID >> 3, j = LANE_ID & 7;
        const u8* blk = w + ((long)n * NSB + b) * 144;
        const u32 qv = LDB(u32, blk, 16 + 32 * g + 4 * j);
        const long xo = ((long)BY * K + 256 * b + 64 * g + 4 * j) / 4;
        const int xlo = LD(int, xq, xo), xhi = LD(int, xq, xo + 8);
        const int lo = (int)(qv & 0x0f0f0f0fu), hi = (int)((qv >> 4) & 0x0f0f0f0fu);
        L(iacc) = k_scale_k4(blk + 4, 2 * g) * k_dp4a(lo, xlo, 0) + k_scale_k4(blk + 4, 2 * g + 1) * k_dp4a(hi, xhi, 0);
        L(imin) = k_min_k4(blk + 4, 2 * g) * k_dp4a(0x01010101, xlo, 0)
                + k_min_k4(blk + 4, 2 * g + 1) * k_dp4a(0x01010101, xhi, 0);
      }}
{_indent(_int_sum("iacc", (16, 8, 4, 2, 1)) + _int_sum("imin", (16, 8, 4, 2, 1)), 2)}
      LANES {{
        const u8* blk = w + ((long)n * NSB + b) * 144;
        const float dx = LD(float, xd, (long)BY * NSB + b);
        L(acc) = k_fma(k_i2f(L(iacc)), k_mul(k_h2f(LDB(u16, blk, 0)), dx), L(acc));
        L(accmin) = k_fma(k_i2f(L(imin)), k_mul(k_h2f(LDB(u16, blk, 2)), dx), L(accmin));
      }}
    }}
    LANES {{ if (LANE_ID == 0) ST(float, y, (long)BY * N + n, k_sub(L(acc), L(accmin))); }}
  }}
"""
    params = _gemv_params(False)
    return Kernel(f"gemv_q4_k_n{n_out}_k{k}", "gemv", 32 * GEMV_WARPS, -(-n_out // GEMV_WARPS), params, body)


def _gemv_q6_k(n_out: int, k: int) -> Kernel:
    """Thread t: lane l = t & 7, quarter p = t >> 3. Value v = 128h + r of a super-block has its low
    4 bits in ql[64h + (r & 63)] >> 4(r >> 6) and its high 2 in qh[32h + (r & 31)] >> 2(r >> 5)
    (ggml-common.h block_q6_K), its scale in scales[v / 16]."""
    if k % 256:
        raise ValueError(f"Q6_K rows must be a multiple of 256 values, not {k}")
    body = f"""\
  LANE(int, isum);
  LANE(int, itmp);
  LANE(float, acc);
  LANE(float, other);
  enum {{ N = {n_out}, K = {k}, NSB = {k // 256} }};
BODY
  const int n = BX * {GEMV_WARPS} + WARP;
  if (n < N) {{
    LANES {{ L(acc) = 0.0f; }}
    for (int b = 0; b < NSB; ++b) {{
      LANES {{
        const int l = LANE_ID & 7, p = LANE_ID >> 3;
        const u8* blk = w + ((long)n * NSB + b) * 210;
        const long x0 = ((long)BY * K + 256 * b) / 4;
        int s = 0;
        for (int c = 2 * p; c < 2 * p + 2; ++c) {{
          const int h = c >> 2, r = 32 * (c & 3) + 4 * l;
          const u32 ql = k_ld_u16x2(blk, 64 * h + (r & 63)) >> (4 * (r >> 6));
          const u32 qh = k_ld_u16x2(blk, 128 + 32 * h + (r & 31)) >> (2 * (r >> 5));
          const int qu = (int)((ql & 0x0f0f0f0fu) | ((qh & 0x03030303u) << 4));
          s += (int)LDB(i8, blk, 192 + 2 * c + (l >> 2)) * k_dp4a(qu, LD(int, xq, x0 + 8 * c + l), 0);
        }}
        // the -32 offset: values 32l + 8p .. 32l + 8p + 7, in sub-block 2l + p / 2
        const int xsum = k_dp4a(0x01010101, LD(int, xq, x0 + 8 * l + 2 * p), 0)
                       + k_dp4a(0x01010101, LD(int, xq, x0 + 8 * l + 2 * p + 1), 0);
        L(isum) = s - 32 * (int)LDB(i8, blk, 192 + 2 * l + (p >> 1)) * xsum;
      }}
{_indent(_int_sum("isum", (8, 16)), 2)}
      LANES {{
        const u8* blk = w + ((long)n * NSB + b) * 210;
        const float dx = LD(float, xd, (long)BY * NSB + b);
        L(acc) = k_fma(k_mul(dx, k_h2f(LDB(u16, blk, 208))), k_i2f(L(isum)), L(acc));
      }}
    }}
{_indent(_HSUM8, 2)}
    LANES {{ if (LANE_ID == 0) ST(float, y, (long)BY * N + n, L(acc)); }}
  }}
"""
    params = _gemv_params(False)
    return Kernel(f"gemv_q6_k_n{n_out}_k{k}", "gemv", 32 * GEMV_WARPS, -(-n_out // GEMV_WARPS), params, body)
