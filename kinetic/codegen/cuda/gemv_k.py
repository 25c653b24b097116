"""GEMV and GEMM kernels for Q5_K and Q3_K weights (super-blocks of 256, Q8_K activations), as CUDA C.

Owns: the two formats' kernel texts. Does not own the tile (gemv_tile.py), the entry points and the
table of formats (gemv.py), the activation quantizer (quantize.py) or the meaning
(kinetic/ir/numerics/dots.py `_parts_dot`, on kinetic/ir/quant_dots.py's integer parts).

Both follow ggml_vec_dot_q5_K_q8_K / ggml_vec_dot_q3_K_q8_K (x86), the reference's "lanes" order:
per super-block, 8 exact int32 lanes, lane l summing over the 8 chunks c of 32 values the values
32c + 4l .. 32c + 4l + 3 times their sub-block scale; each lane chain
acc_l = fma(f32(lane_l), d_x * d_w, acc_l) over the super-blocks in order; y = hsum_float_8(acc).
Q5_K adds its minimums: imin = sum of min_s * (sum of the Q8_K quants of sub-block s) (exact), and
accm = fma(-(d_x * dmin_w), f32(imin), accm) over the super-blocks; y = hsum_float_8(acc) + accm.

The kernel has Q6_K's shape (gemv.py): one warp per output, thread t = 8p + l holds lane l of
chunks 2p and 2p + 1; the four p of a lane are summed exactly by integer shuffles (xor 8, 16), every
thread of lane l then runs the same chain, and the butterfly xor 4, 2, 1 is hsum_float_8. Q5_K's
imin is summed over the whole warp (exact in any order). Rows never mix (gemv.py's docstring).

Block layouts (ggml-common.h): block_q5_K = d, dmin (f16), scales[12] (get_scale_min_k4), qh[32],
qs[128]: value 32c + j has its low nibble in qs[32(c >> 1) + j] >> 4(c & 1) and its fifth bit in
bit c of qh[j]. block_q3_K = hmask[32], qs[64], scales[12] (16 six-bit scales, offset 32), d (f16):
value 32c + j (c = 4h + s) has its low 2 bits in qs[32h + j] >> 2s, and 4 is subtracted unless bit c
of hmask[j] is set; its scale is the one of its 16 values. Q3_K blocks (110 bytes) are 2-byte
aligned, so their words are read as two halves (k_ld_u16x2).
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cuda.gemv_tile import GEMV_WARPS, Tile, hsum8
from kinetic.codegen.cuda.kernel import Kernel, indent, int_sum
from kinetic.ir.quants import QUANT_TYPES

# per format, C code that, given `blk` (the super-block's first byte), `l` (lane) and `p` (quarter),
# defines for i < 2 (chunk c = 2p + i) `qv[i]`: the 4 signed 8-bit weights of values 32c + 4l ..
# 32c + 4l + 3 packed for dp4a, and `sc[i]`: their scale; Q5_K also `mn[i]`, the chunk's minimum
DECODE: dict[Q, str] = {
    Q.Q5_K: """\
const u32 qs = LDB(u32, blk, 48 + 32 * p + 4 * l), qh = LDB(u32, blk, 16 + 4 * l);
#pragma unroll
for (int i = 0; i < 2; ++i) {
  const int c = 2 * p + i;
  qv[i] = (int)(((qs >> (4 * i)) & 0x0f0f0f0fu) | (((qh >> c) & 0x01010101u) << 4));
  sc[i] = k_scale_k4(blk + 4, c);
  mn[i] = k_min_k4(blk + 4, c);
}""",
    # low crumbs | high bit << 2 is 0..7; + 0x7c then ^ 0x80 subtracts 4 per byte, no carry between bytes
    Q.Q3_K: """\
const u32 hm = k_ld_u16x2(blk, 4 * l);
#pragma unroll
for (int i = 0; i < 2; ++i) {
  const int c = 2 * p + i;
  const u32 low = (k_ld_u16x2(blk, 32 + 32 * (c >> 2) + 4 * l) >> (2 * (c & 3))) & 0x03030303u;
  qv[i] = (int)(((low | (((hm >> c) & 0x01010101u) << 2)) + 0x7c7c7c7cu) ^ 0x80808080u);
  sc[i] = k_scale_q3_k(blk + 96, 2 * c + (l >> 2));
}""",
}
D_OFFSET = {Q.Q5_K: 0, Q.Q3_K: 108}  # the f16 d of each block (Q5_K's dmin follows at 2)
SUPPORTED = frozenset(DECODE)
# activation rows per GEMM block: Q6_K's 4 (the same shape, and Q5_K's minimum chains besides)
GEMM_ROWS = {Q.Q5_K: 4, Q.Q3_K: 4}


def lanes_k(wtype: Q, n_out: int, k: int, tile: Tile) -> Kernel:
    """The GEMV (tile rows None) or GEMM of Q5_K / Q3_K weights [n_out, k]. Parameters: w, xq, xd,
    y[, n_rows]."""
    if wtype not in DECODE:
        raise NotImplementedError(f"no CUDA GEMV for {wtype.name}")
    if k % 256:
        raise ValueError(f"{wtype.name} rows must be a multiple of 256 values, not {k}")
    has_min = QUANT_TYPES[wtype].has_min
    isum, imin, acc, accm = (tile.of(v) for v in ("isum", "imin", "acc", "accm"))
    min_sum = "\n  m += mn[i] * k_dp4a(0x01010101, xv, 0);" if has_min else ""
    integer = f"""\
const long x0 = ((long)row * K + 256 * b) / 4;
int s = 0{", m = 0" if has_min else ""};
#pragma unroll
for (int i = 0; i < 2; ++i) {{
  const int xv = LD(int, xq, x0 + 8 * (2 * p + i) + l);
  s += sc[i] * k_dp4a(qv[i], xv, 0);{min_sum}
}}
L({isum}) = s;{f" L({imin}) = m;" if has_min else ""}"""
    sums = int_sum(isum, (8, 16), 0) + (int_sum(imin, (16, 8, 4, 2, 1), 0) if has_min else "")
    chain = f"""\
const float dx = LD(float, xd, (long)row * NSB + b);
L({acc}) = k_fma(k_i2f(L({isum})), k_mul(dx, dw), L({acc}));"""
    if has_min:
        chain += f"\nL({accm}) = k_fma(-k_mul(dx, dmin), k_i2f(L({imin})), L({accm}));"
    init = f"L({acc}) = 0.0f;" + (f" L({accm}) = 0.0f;" if has_min else "")
    result = f"k_add(L({acc}), L({accm}))" if has_min else f"L({acc})"
    block_bytes = QUANT_TYPES[wtype].block_bytes
    scales = f"k_h2f(LDB(u16, blk, {D_OFFSET[wtype]}))"
    body = f"""\
{tile.declare("int", "isum")}{tile.declare("int", "imin") if has_min else ""}\
  LANE(int, itmp);
{tile.declare("float", "acc")}{tile.declare("float", "accm") if has_min else ""}\
  LANE(float, other);
  enum {{ N = {n_out}, K = {k}, NSB = {k // 256}, BLOCK_BYTES = {block_bytes} }};
BODY
{tile.top}\
  const int n = BX * {GEMV_WARPS} + WARP;
  if (n < N) {{
    LANES {{
{tile.each_row(init, 6)}\
    }}
    for (int b = 0; b < NSB; ++b) {{
      LANES {{
        const int l = LANE_ID & 7, p = LANE_ID >> 3;
        const u8* blk = w + ((long)n * NSB + b) * BLOCK_BYTES;
        int qv[2], sc[2]{", mn[2]" if has_min else ""};
{indent(DECODE[wtype], 8)}
{tile.each_row(integer, 8)}\
      }}
{tile.each_row(sums, 6)}\
      LANES {{
        const u8* blk = w + ((long)n * NSB + b) * BLOCK_BYTES;
        const float dw = {scales};{" const float dmin = k_h2f(LDB(u16, blk, 2));" if has_min else ""}
{tile.each_row(chain, 8)}\
      }}
    }}
{tile.each_row(hsum8(acc), 4)}\
    LANES {{
      if (LANE_ID == 0) {{
{tile.each_row(f"ST(float, y, (long)row * N + n, {result});", 8)}\
      }}
    }}
  }}
"""
    return tile.kernel(wtype, n_out, k, -(-n_out // GEMV_WARPS), False, body)

