"""GEMV and GEMM kernels for Q2_K weights (super-blocks of 256, Q8_K activations), as CUDA C.

Owns: the Q2_K kernel text and the kernel frame Q4_K's (gemv.py) shares with it. Does not own the tile
(gemv_tile.py), the entry points (gemv.py), the activation quantizer (quantize.py) or the meaning
(kinetic/ir/numerics/dots.py `_parts_dot`, "scalar" order, on kinetic/ir/quant_dots.py's integer parts).

The order is the repacked gemv llama.cpp runs for Q2_K on x86 (ggml_gemv_q2_K_8x8_q8_K), as for
Q4_K: per super-block the exact integer sums iacc = sum of sc * q * q_x over its 256 values and
imin = sum of m * (sum of q_x) over its 16 sub-blocks of 16, then one float chain
acc = fma(f32(iacc), d_x * d_w, acc) and its twin accmin = fma(f32(imin), d_x * dmin_w, accmin)
over the super-blocks in order; y = acc - accmin. The kernel has Q4_K's shape (gemv.py): one warp
per output, the integer sums over the warp by shuffles (exact in any order), the chains alike in
every thread.

block_q2_K (ggml-common.h): scales[16] (per 16 values: the scale in the low nibble, the minimum in
the high one), qs[64], d, dmin (f16). Value 128h + 32s + j has its 2 bits in qs[32h + j] >> 2s.
Thread t = 2w + p takes the word w = 8h + j4 of qs (bytes 32h + 4j4 ..) and its crumbs s = 2p,
2p + 1: values 128h + 32s + 4j4 .. + 3, in sub-block 8h + 2s + (j4 >> 2).
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cuda.gemv_tile import GEMV_WARPS, Tile
from kinetic.codegen.cuda.kernel import Kernel, int_sum
from kinetic.ir.quants import QUANT_TYPES

SUPPORTED = frozenset({Q.Q2_K})
GEMM_ROWS = {Q.Q2_K: 8}  # Q4_K's tile: the same per-row state


def q2_k(n_out: int, k: int, tile: Tile) -> Kernel:
    """The GEMV (tile rows None) or GEMM of Q2_K weights [n_out, k]. Parameters: w, xq, xd, y[, n_rows]."""
    if k % 256:
        raise ValueError(f"Q2_K rows must be a multiple of 256 values, not {k}")
    acc, accmin = tile.of("acc"), tile.of("accmin")
    per_row = f"""\
LANES {{
  const int w4 = LANE_ID >> 1, p = LANE_ID & 1, h = w4 >> 3, j4 = w4 & 7;
  const long xo = ((long)row * K + 256 * b + 128 * h + 4 * j4) / 4;
  int ia = 0, im = 0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {{
    const int xv = LD(int, xq, xo + 8 * (2 * p + i));
    ia += L(sc[i]) * k_dp4a(L(qv[i]), xv, 0);
    im += L(mn[i]) * k_dp4a(0x01010101, xv, 0);
  }}
  L(iacc) = ia; L(imin) = im;
}}
{int_sum("iacc", (16, 8, 4, 2, 1), 0)}{int_sum("imin", (16, 8, 4, 2, 1), 0)}\
LANES {{
  const float dx = LD(float, xd, (long)row * NSB + b);
  L({acc}) = k_fma(k_i2f(L(iacc)), k_mul(dx, L(dw)), L({acc}));
  L({accmin}) = k_fma(k_i2f(L(imin)), k_mul(dx, L(dmin)), L({accmin}));
}}"""
    decode = """\
        const int w4 = LANE_ID >> 1, p = LANE_ID & 1, h = w4 >> 3, j4 = w4 & 7;
        const u8* blk = w + ((long)n * NSB + b) * BLOCK_BYTES;
        const u32 qs = LDB(u32, blk, 16 + 4 * w4);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int s = 2 * p + i, sub = LDB(u8, blk, 8 * h + 2 * s + (j4 >> 2));
          L(qv[i]) = (int)((qs >> (2 * s)) & 0x03030303u);
          L(sc[i]) = sub & 15;
          L(mn[i]) = sub >> 4;
        }
        L(dw) = k_h2f(LDB(u16, blk, 80)); L(dmin) = k_h2f(LDB(u16, blk, 82));
"""
    return chains_kernel(Q.Q2_K, n_out, k, tile, lanes=("qv[2]", "sc[2]", "mn[2]"), decode=decode,
                         per_row=per_row, enums=f", BLOCK_BYTES = {QUANT_TYPES[Q.Q2_K].block_bytes}")


def chains_kernel(wtype: Q, n_out: int, k: int, tile: Tile, *, lanes: tuple[str, ...], decode: str,
                  per_row: str, enums: str = "") -> Kernel:
    """The kernel Q2_K and Q4_K (gemv.py) share: one warp per output, per super-block b `decode` (the
    weights into the int LANE values `lanes`, the float ones dw and dmin), then `per_row` for each row
    of the tile (its integer sums into the chains acc and accmin); lane 0 stores acc - accmin. `enums`:
    more constants after N, K, NSB."""
    acc, accmin = tile.of("acc"), tile.of("accmin")
    declared = "".join(f"  LANE(int, {name});\n" for name in ("iacc", "imin", "itmp", *lanes))
    body = f"""\
{declared}\
  LANE(float, dw);
  LANE(float, dmin);
{tile.declare("float", "acc")}{tile.declare("float", "accmin")}\
  enum {{ N = {n_out}, K = {k}, NSB = {k // 256}{enums} }};
BODY
{tile.top}\
  const int n = BX * {GEMV_WARPS} + WARP;
  if (n < N) {{
    LANES {{
{tile.each_row(f"L({acc}) = 0.0f; L({accmin}) = 0.0f;", 6)}\
    }}
    for (int b = 0; b < NSB; ++b) {{
      LANES {{
{decode}\
      }}
{tile.each_row(per_row, 6)}\
    }}
    LANES {{
      if (LANE_ID == 0) {{
{tile.each_row(f"ST(float, y, (long)row * N + n, k_sub(L({acc}), L({accmin})));", 8)}\
      }}
    }}
  }}
"""
    return tile.kernel(wtype, n_out, k, -(-n_out // GEMV_WARPS), False, body)
