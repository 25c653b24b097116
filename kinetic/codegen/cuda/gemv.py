"""Quantized matrix-vector and row-tiled matrix kernels, as CUDA C.

Owns: the entry points `gemv` / `gemm` for every weight format CUDA runs, and the kernels of Q8_0,
Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K and Q6_K: per format a GEMV kernel (one activation row per block) and a
GEMM kernel (a tile of GEMM_ROWS rows per block, for prompts), each specialized to its shape. Q5_K
and Q3_K are rendered by gemv_k.py, Q2_K by gemv_q2_k.py, F16 and BF16 (f32 rows, no quantizer) by
gemv_float.py, F32 by gemv_f32.py, on the same tile (gemv_tile.py). Does not own: the activation quantizers
(quantize.py), the facts of each type (block bytes, activation format, dot order:
kinetic/ir/quants.py's QUANT_TYPES, which `activation_format` and `block32_order` read), the meaning
(kinetic/ir/numerics) or compiling and launching.

Every kernel sums in exactly the reference's order (numerics.matmul, which is ggml's x86 order for a
decode row), so a GPU, the host emulation and the reference interpreter agree bit for bit:

* block-32 formats, "lanes" order (numerics/dots.py, _lane_dot): 8 float lanes per output, lane l
  holding values 4l..4l+3 of every block. Here 8 threads per output, thread l one lane: per block the exact
  integer dot of its 4 values (one dp4a) and `acc = fma(d_w * d_x, f32(dot), acc)`, blocks in
  order; then the 8 lanes summed as ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)), which is a butterfly over
  the lane bits, shuffles with lane ^ 4, ^ 2, ^ 1 (float addition is commutative, so both partners
  get the same sum). Q8_1 formats add the sum over blocks of m_w * s_x, in block order, at the end.
  "scalar" order (llama.cpp's repacked gemv): the 8 integer parts summed exactly per block, one chain.
* Q4_K (numerics/dots.py, _superblock_dot; ggml's repacked gemv): one warp per output; per
  super-block the exact integer sums iacc = sum sc*q*q_x and imin = sum m*bsum32(q_x) over the warp (integer
  shuffles: exact in any order), then one float chain acc = fma(f32(iacc), d_w*d_x, acc),
  accmin likewise, result acc - accmin.
* Q6_K (ggml_vec_dot_q6_K_q8_K): one warp per output, 8 float lanes; thread (p, l) adds the integer
  part of lane l over chunks 2p, 2p+1 and its quarter of the -32 offset, the four quarters are summed
  exactly by shuffles, each lane chain acc_l = fma(d_x*d_w, f32(lane_l), acc_l) runs over the
  super-blocks in order, and the 8 lanes end in the same butterfly as above.

Rows never mix. The GEMV's grid y is the row. The GEMM (grid y a tile of R rows, `rows_per_block`)
exists so that a prompt reads each weight block once per R rows instead of once per row: each
thread decodes its weight values (and their scales) once per block or super-block and applies them
to the tile's rows, keeping R accumulators. Both are rendered from one text per format (`Tile`):
the per-row statements are the same, only wrapped in a loop over the tile's rows for the GEMM, so
every row gets the same operations, on the same values, in the same order as in the GEMV: the same
integer dots (exact), the same fma chain over the blocks, the same shuffles with the same lanes.
Row r's accumulators are only ever combined with row r's (a shuffle exchanges acc[r] between the
lanes of one output), no value of one row enters another row's arithmetic, and rows of the tile at
or past `n_rows` are skipped (no loads, no stores). So a row's result does not depend on the other
rows of its tile, nor on where in a tile it sits: gemm gives every row gemv's bits, and a batch
gives every row what it gets alone.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cuda import gemv_f32, gemv_float, gemv_k, gemv_q2_k
from kinetic.codegen.cuda.gemv_tile import GEMV_WARPS, Tile, hsum8
from kinetic.codegen.cuda.kernel import Kernel, indent, int_sum
from kinetic.ir.quants import QUANT_TYPES

# nibble j < 16 of a block is the low half of byte j, nibble 16 + j the high half: lane l < 4 reads
# the low halves of bytes 4l..4l+3, lane l >= 4 the high halves of bytes 4(l-4)..
_NIBBLES = "((l < 4 ? qs : qs >> 4) & 0x0f0f0f0fu)"
# IQ4_NL's 16 signed values as two little-endian 64-bit words of bytes (values 0..7, 8..15)
_CODEBOOK_WORDS = [hex(int.from_bytes(bytes(v & 0xFF for v in QUANT_TYPES[Q.IQ4_NL].codebook[h : h + 8]), "little"))
                   for h in (0, 8)]
# bit 4l + i of qh moved to bit 4 of byte i (the fifth bit of values 4l..4l+3)
_HIGH_BITS = "const u32 hb = ((qh & 1u) << 4) | ((qh & 2u) << 11) | ((qh & 4u) << 18) | ((qh & 8u) << 25);"

# Per block-32 format, its per-lane decoding: C code that, given `blk` (the block's first byte) and
# `l` (the lane 0..7), defines `wv`: the 4 signed 8-bit weights of values 4l..4l+3 packed in an int,
# as dp4a takes them. (Q8_1 formats' f16 minimum m sits at byte 2.)
BLOCK32: dict[Q, str] = {
    Q.Q8_0: "const int wv = (int)k_ld_u16x2(blk, 2 + 4 * l);",
    # bytes + 0x78 then ^ 0x80: each nibble minus 8 as a signed byte, no carry between bytes
    Q.Q4_0: f"const u32 qs = k_ld_u16x2(blk, 2 + 4 * (l & 3));\n"
            f"const int wv = (int)(({_NIBBLES} + 0x78787878u) ^ 0x80808080u);",
    Q.Q4_1: f"const u32 qs = LDB(u32, blk, 4 + 4 * (l & 3));\n"
            f"const int wv = (int){_NIBBLES};",
    Q.Q5_0: f"const u32 qs = k_ld_u16x2(blk, 6 + 4 * (l & 3));\n"
            f"const u32 qh = k_ld_u16x2(blk, 2) >> (4 * l);\n{_HIGH_BITS}\n"
            f"const int wv = (int)((({_NIBBLES} | hb) + 0x70707070u) ^ 0x80808080u);",
    Q.Q5_1: f"const u32 qs = LDB(u32, blk, 8 + 4 * (l & 3));\n"
            f"const u32 qh = LDB(u32, blk, 4) >> (4 * l);\n{_HIGH_BITS}\n"
            f"const int wv = (int)({_NIBBLES} | hb);",
    # Q4_0's layout, each nibble read through the codebook (two 64-bit words of 8 signed bytes)
    Q.IQ4_NL: f"const u32 qs = k_ld_u16x2(blk, 2 + 4 * (l & 3));\n"
              f"const u32 nibbles = {_NIBBLES};\nu32 coded = 0;\n"
              f"#pragma unroll\nfor (int j = 0; j < 4; ++j) {{\n"
              f"  const u32 q = (nibbles >> (8 * j)) & 15u;\n"
              f"  const unsigned long long book = q < 8 ? {_CODEBOOK_WORDS[0]}ull : {_CODEBOOK_WORDS[1]}ull;\n"
              f"  coded |= (u32)((book >> (8 * (q & 7))) & 0xffull) << (8 * j);\n}}\n"
              f"const int wv = (int)coded;",
}
# super-blocks of 256 values (Q8_K rows): Q4_K and Q6_K here, Q5_K and Q3_K in gemv_k.py, Q2_K in
# gemv_q2_k.py
SUPERBLOCK = frozenset({Q.Q4_K, Q.Q6_K}) | gemv_k.SUPPORTED | gemv_q2_k.SUPPORTED
SUPPORTED = frozenset(BLOCK32) | SUPERBLOCK  # the formats whose rows a quantize node makes (Q8_*)
# float weights: the kernel reads the f32 rows (and rounds them to F16 / BF16 itself)
FLOAT = gemv_float.SUPPORTED | gemv_f32.SUPPORTED
ALL = SUPPORTED | FLOAT


def activation_format(wtype: Q) -> str:
    """The format a row takes before a GEMV with this weight type (QUANT_TYPES' activation): an 8-bit
    format a quantizer writes, or a float type the GEMV rounds to itself."""
    if wtype not in ALL:
        raise NotImplementedError(f"no CUDA GEMV for {wtype.name}")
    return QUANT_TYPES[wtype].activation


# ---- GEMV and GEMM ------------------------------------------------------------------------------------

# activation rows per block of the GEMM (its tile), per weight format: 8 where every architecture
# stays within caps.BUDGETS["gemm"] without spills, 4 for Q6_K (8 reached the 64-register budget on
# sm_75; 4 uses at most 55) and Q5_K / Q3_K (its shape; at most 57); measured on sm_75, the tightest:
# Q2_K 62, F16 / BF16 57 (their tail loop kept rolled)
GEMM_ROWS = {Q.Q8_0: 8, Q.Q4_0: 8, Q.Q4_1: 8, Q.Q5_0: 8, Q.Q5_1: 8, Q.IQ4_NL: 8, Q.Q4_K: 8, Q.Q6_K: 4,
             **gemv_k.GEMM_ROWS, **gemv_q2_k.GEMM_ROWS, **gemv_float.GEMM_ROWS, **gemv_f32.GEMM_ROWS}


def gemv(wtype: Q, n_out: int, k: int) -> Kernel:
    """y [rows, n_out] = x [rows, k] times weight [n_out, k] transposed, x given quantized (quantize());
    one activation row per block row of the grid. Parameters: w, xq, xd[, xs], y (float weights:
    w, x, y, with x the f32 rows)."""
    return _matmul(wtype, n_out, k, Tile(None))


def gemm(wtype: Q, n_out: int, k: int) -> Kernel:
    """The GEMV's product with GEMM_ROWS[wtype] activation rows per block, each weight value decoded
    once for all of them. Parameters: w, xq, xd[, xs], y, n_rows (the pass's rows: the last block's
    rows at or past it are skipped). Every row's result is the GEMV's, bit for bit."""
    if wtype not in GEMM_ROWS:
        raise NotImplementedError(f"no CUDA GEMM for {wtype.name}")
    return _matmul(wtype, n_out, k, Tile(GEMM_ROWS[wtype]))


def _matmul(wtype: Q, n_out: int, k: int, tile: Tile) -> Kernel:
    if wtype in BLOCK32:
        return _block32(wtype, n_out, k, tile)
    if wtype is Q.Q4_K:
        return _q4_k(n_out, k, tile)
    if wtype is Q.Q6_K:
        return _q6_k(n_out, k, tile)
    if wtype in gemv_k.SUPPORTED:
        return gemv_k.lanes_k(wtype, n_out, k, tile)
    if wtype is Q.Q2_K:
        return gemv_q2_k.q2_k(n_out, k, tile)
    if wtype is Q.F32:
        return gemv_f32.f32_gemv(n_out, k, tile)
    if wtype in FLOAT:
        return gemv_float.float_gemv(wtype, n_out, k, tile)
    raise NotImplementedError(f"no CUDA GEMV for {wtype.name}")


def block32_order(wtype: Q) -> str:
    """How the reference sums a block-32 type: "lanes" (ggml's vec-dots: 8 float lanes) or "scalar"
    (llama.cpp's repacked gemv: one float chain of whole block dots). Read from QUANT_TYPES, the table
    the reference reads too, so a kernel follows it when it changes."""
    order = QUANT_TYPES[wtype].dot_order
    if QUANT_TYPES[wtype].block != 32 or order not in ("lanes", "scalar"):
        raise NotImplementedError(f"the reference sums {wtype.name} in neither block-32 order")
    return order


def _block32(wtype: Q, n_out: int, k: int, tile: Tile) -> Kernel:
    """8 threads per output, thread l holding values 4l..4l+3 of every block, decoded once per block.
    "lanes": each thread one float lane of every row, the butterfly at the end. "scalar": per row the
    8 integer parts summed by an integer butterfly (exact), then one float chain
    acc = fma(f32(dot), d_x*d_w, acc) that the 8 threads run alike."""
    facts = QUANT_TYPES[wtype]
    if k % 32:
        raise ValueError(f"{wtype.name} rows must be a multiple of 32 values, not {k}")
    nb, q8_1, scalar = k // 32, facts.activation == "q8_1", block32_order(wtype) == "scalar"
    if scalar and q8_1:
        raise NotImplementedError(f"{wtype.name}: the scalar order has no Q8_1 minimum term here")
    acc, summs = tile.of("acc"), tile.of("summs")
    xv, dx = "LD(int, xq, ((long)row * K + 32 * b) / 4 + l)", "LD(float, xd, (long)row * NB + b)"
    decode = f"const int l = LANE_ID & 7;\nconst u8* blk = w + ((long)L(n) * NB + b) * BLOCK_BYTES;\n{BLOCK32[wtype]}\n"
    if scalar:
        declare = "  LANE(int, wq);\n  LANE(float, dw);\n  LANE(int, part);\n  LANE(int, itmp);\n"
        decode += "L(wq) = wv;\nL(dw) = k_h2f(LDB(u16, blk, 0));"
        per_row = f"""\
LANES {{ const int l = LANE_ID & 7; L(part) = L(n) < N ? k_dp4a(L(wq), {xv}, 0) : 0; }}
{int_sum("part", (4, 2, 1), 0)}\
LANES {{ if (L(n) < N) L({acc}) = k_fma(k_i2f(L(part)), k_mul({dx}, L(dw)), L({acc})); }}"""
        per_block, finish = tile.each_row(per_row, 4), ""
    else:
        declare = tile.declare("float", "summs") if q8_1 else ""
        decode += "const float dw = k_h2f(LDB(u16, blk, 0));"
        step = f"L({acc}) = k_fma(k_mul(dw, {dx}), k_i2f(k_dp4a(wv, {xv}, 0)), L({acc}));"
        if q8_1:
            decode += "\nconst float mw = k_h2f(LDB(u16, blk, 2));"
            step += f"\nL({summs}) = k_add(L({summs}), k_mul(mw, LD(float, xs, (long)row * NB + b)));"
        per_block, finish = tile.each_row(step, 8), tile.each_row(hsum8(acc), 2)
    init = f"L({acc}) = 0.0f;" + (f" L({summs}) = 0.0f;" if q8_1 else "")
    result = f"k_add(L({acc}), L({summs}))" if q8_1 else f"L({acc})"
    body = f"""\
  LANE(int, n);
{tile.declare("float", "acc")}\
  LANE(float, other);
{declare}\
  enum {{ N = {n_out}, K = {k}, NB = {nb}, BLOCK_BYTES = {facts.block_bytes} }};
BODY
{tile.top}\
  LANES {{
    L(n) = (BX * {GEMV_WARPS} + WARP) * 4 + (LANE_ID >> 3);
{tile.each_row(init, 4)}\
  }}
  for (int b = 0; b < NB; ++b) {{
    LANES {{
      if (L(n) < N) {{
{indent(decode, 8)}
{"" if scalar else per_block}\
      }}
    }}
{per_block if scalar else ""}\
  }}
{finish}\
  LANES {{
    if (L(n) < N && (LANE_ID & 7) == 0) {{
{tile.each_row(f"ST(float, y, (long)row * N + L(n), {result});", 6)}\
    }}
  }}
"""
    outputs = 4 * GEMV_WARPS  # per block: 4 per warp, 8 threads each
    return tile.kernel(wtype, n_out, k, -(-n_out // outputs), q8_1, body)


def _q4_k(n_out: int, k: int, tile: Tile) -> Kernel:
    """One warp per output. Thread t: group g = t >> 3 of 64 values, bytes 4j..4j+3 (j = t & 7) of
    its 32 qs bytes, whose low nibbles are values 64g+4j.. (sub-block 2g), high nibbles 64g+32+4j..
    (2g+1). Per super-block each thread decodes its weights once; then each row of the tile in turn:
    its integer sums, their butterflies, its two float chains."""
    if k % 256:
        raise ValueError(f"Q4_K rows must be a multiple of 256 values, not {k}")
    acc, accmin = tile.of("acc"), tile.of("accmin")
    per_row = f"""\
LANES {{
  const long xo = ((long)row * K + 256 * b + 64 * (LANE_ID >> 3) + 4 * (LANE_ID & 7)) / 4;
  const int xlo = LD(int, xq, xo), xhi = LD(int, xq, xo + 8);
  L(iacc) = L(sc_lo) * k_dp4a(L(lo), xlo, 0) + L(sc_hi) * k_dp4a(L(hi), xhi, 0);
  L(imin) = L(m_lo) * k_dp4a(0x01010101, xlo, 0) + L(m_hi) * k_dp4a(0x01010101, xhi, 0);
}}
{int_sum("iacc", (16, 8, 4, 2, 1), 0)}{int_sum("imin", (16, 8, 4, 2, 1), 0)}\
LANES {{
  const float dx = LD(float, xd, (long)row * NSB + b);
  L({acc}) = k_fma(k_i2f(L(iacc)), k_mul(L(dw), dx), L({acc}));
  L({accmin}) = k_fma(k_i2f(L(imin)), k_mul(L(dmin), dx), L({accmin}));
}}"""
    decode = f"""\
        const int g = LANE_ID >> 3, j = LANE_ID & 7;
        const u8* blk = w + ((long)n * NSB + b) * {QUANT_TYPES[Q.Q4_K].block_bytes};
        const u32 qv = LDB(u32, blk, 16 + 32 * g + 4 * j);
        L(lo) = (int)(qv & 0x0f0f0f0fu); L(hi) = (int)((qv >> 4) & 0x0f0f0f0fu);
        L(sc_lo) = k_scale_k4(blk + 4, 2 * g); L(sc_hi) = k_scale_k4(blk + 4, 2 * g + 1);
        L(m_lo) = k_min_k4(blk + 4, 2 * g); L(m_hi) = k_min_k4(blk + 4, 2 * g + 1);
        L(dw) = k_h2f(LDB(u16, blk, 0)); L(dmin) = k_h2f(LDB(u16, blk, 2));
"""
    return gemv_q2_k.chains_kernel(Q.Q4_K, n_out, k, tile, lanes=("lo", "hi", "sc_lo", "sc_hi", "m_lo", "m_hi"),
                                   decode=decode, per_row=per_row)


def _q6_k(n_out: int, k: int, tile: Tile) -> Kernel:
    """One warp per output. Thread t: lane l = t & 7, quarter p = t >> 3, chunks c = 2p + i (i < 2)
    of 4 values 32(c & 3) + 4l.. of half c >> 2. Value v = 128h + a of a super-block has its low 4
    bits in ql[64h + (a & 63)] >> 4(a >> 6) and its high 2 in qh[32h + (a & 31)] >> 2(a >> 5)
    (ggml-common.h block_q6_K), its scale in scales[v / 16]. Per super-block each thread decodes its
    weights once and takes the integer part of every row of the tile; then per row the butterfly and
    the chain."""
    if k % 256:
        raise ValueError(f"Q6_K rows must be a multiple of 256 values, not {k}")
    isum, acc = tile.of("isum"), tile.of("acc")
    block_bytes = QUANT_TYPES[Q.Q6_K].block_bytes
    integer = f"""\
const long x0 = ((long)row * K + 256 * b) / 4;
int s = 0;
for (int i = 0; i < 2; ++i) s += sc[i] * k_dp4a(qu[i], LD(int, xq, x0 + 8 * (2 * p + i) + l), 0);
// the -32 offset: values 32l + 8p .. 32l + 8p + 7, in sub-block 2l + p / 2
const int xsum = k_dp4a(0x01010101, LD(int, xq, x0 + 8 * l + 2 * p), 0)
               + k_dp4a(0x01010101, LD(int, xq, x0 + 8 * l + 2 * p + 1), 0);
L({isum}) = s - 32 * offset_scale * xsum;"""
    chain = f"L({acc}) = k_fma(k_mul(LD(float, xd, (long)row * NSB + b), dw), k_i2f(L({isum})), L({acc}));"
    body = f"""\
{tile.declare("int", "isum")}\
  LANE(int, itmp);
{tile.declare("float", "acc")}\
  LANE(float, other);
  enum {{ N = {n_out}, K = {k}, NSB = {k // 256} }};
BODY
{tile.top}\
  const int n = BX * {GEMV_WARPS} + WARP;
  if (n < N) {{
    LANES {{
{tile.each_row(f"L({acc}) = 0.0f;", 6)}\
    }}
    for (int b = 0; b < NSB; ++b) {{
      LANES {{
        const int l = LANE_ID & 7, p = LANE_ID >> 3;
        const u8* blk = w + ((long)n * NSB + b) * {block_bytes};
        int qu[2], sc[2];
        for (int i = 0; i < 2; ++i) {{
          const int c = 2 * p + i, h = c >> 2, a = 32 * (c & 3) + 4 * l;
          const u32 ql = k_ld_u16x2(blk, 64 * h + (a & 63)) >> (4 * (a >> 6));
          const u32 qh = k_ld_u16x2(blk, 128 + 32 * h + (a & 31)) >> (2 * (a >> 5));
          qu[i] = (int)((ql & 0x0f0f0f0fu) | ((qh & 0x03030303u) << 4));
          sc[i] = (int)LDB(i8, blk, 192 + 2 * c + (l >> 2));
        }}
        const int offset_scale = (int)LDB(i8, blk, 192 + 2 * l + (p >> 1));
{tile.each_row(integer, 8)}\
      }}
{tile.each_row(int_sum(isum, (8, 16), 0), 6)}\
      LANES {{
        const float dw = k_h2f(LDB(u16, w + ((long)n * NSB + b) * {block_bytes}, 208));
{tile.each_row(chain, 8)}\
      }}
    }}
{tile.each_row(hsum8(acc), 4)}\
    LANES {{
      if (LANE_ID == 0) {{
{tile.each_row(f"ST(float, y, (long)row * N + n, L({acc}));", 8)}\
      }}
    }}
  }}
"""
    return tile.kernel(Q.Q6_K, n_out, k, -(-n_out // GEMV_WARPS), False, body)
