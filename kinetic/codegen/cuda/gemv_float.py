"""GEMV and GEMM kernels for float weights (F16, BF16), reading f32 activation rows, as CUDA C.

Owns: the F16 and BF16 kernel texts, and the kernel frame and F16 reduction gemv_f32.py shares. Does not
own the tile (gemv_tile.py), the entry points and the table of formats (gemv.py) or the meaning
(kinetic/ir/numerics/dots.py `float_dot`, ggml_vec_dot_f16 and ggml_vec_dot_bf16 as the reference builds
them).

A float weight's dot takes the activations rounded to the weight's own type (QUANT_TYPES'
activation "f16" / "bf16"): each thread rounds the values it reads (F16: cvt.rn.f16.f32, as numpy's
astype; BF16: ggml_compute_fp32_to_bf16, half to even, a NaN kept quiet), so there is no quantizer
launch and no quantize node; the matmul reads the f32 row its producer wrote. Then float_dot's order:

* F16: 64 float lanes per output, lane i summing x*w of values 64c + i over the chunks c in order (a
  product of two f16 values is exact in f32, so fma and numpy's add of the product round alike);
  t16 = (lanes 0..15 + lanes 32..47) + (lanes 16..31 + lanes 48..63), then _mm512_reduce_add_ps over
  t16: halves 16 -> 8 -> 4, then (v0 + v2) + (v1 + v3). One warp per output: thread t holds lanes t
  and t + 32, so its own add is t16's inner pair, and the butterfly xor 16, 8, 4, 2, 1 is the rest of
  the tree exactly (float addition commutes, so both partners get the same sum).
* BF16 (vdpbf16ps): 2 x 16 lanes per output, lane i = 16v + l taking values 64c + 32v + 2l + 1 and
  then 64c + 32v + 2l of each chunk, each step an fma whose bf16 inputs and f32 result have their
  subnormals flushed to signed zeros; each vector of 16 reduced on its own (_mm512_reduce_add_ps: the
  butterfly xor 8, 4, 2, 1 within a half warp), the two sums added in float64 to 0. Thread t is lane t.

Either way the K % 64 last values are added one by one in float64 to that sum (their f32 products,
neither operand flushed), rounded to f32 at the end; lane 0 does it. Rows never mix (gemv.py).
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cuda.gemv_tile import GEMV_WARPS, Tile
from kinetic.codegen.cuda.kernel import Kernel, Param, butterfly
from kinetic.ir.numerics.dots import FLOAT_CHUNK

SUPPORTED = frozenset({Q.F16, Q.BF16})
GEMM_ROWS = {Q.F16: 8, Q.BF16: 8}
ACTIVATIONS = (Param("x", "const float*"),)  # the f32 row, rounded by the kernel
# per type: the C expression of activation value `v` rounded to the type, and of its weight from u16 `h`
ROUND = {Q.F16: "k_h2f(k_f2h({v}))", Q.BF16: "k_bf16_round({v})"}
WEIGHT = {Q.F16: "k_h2f({h})", Q.BF16: "k_bits2f((u32)({h}) << 16)"}


def float_gemv(wtype: Q, n_out: int, k: int, tile: Tile) -> Kernel:
    """The GEMV (tile rows None) or GEMM of F16 / BF16 weights [n_out, k] (raw 16-bit values) against
    f32 rows. Parameters: w, x, y[, n_rows]."""
    if wtype not in SUPPORTED:
        raise NotImplementedError(f"no CUDA GEMV for {wtype.name}")
    if k % 2:
        raise ValueError(f"{wtype.name} rows of an odd number of values ({k}) have no CUDA kernel")
    chunk, lanes_done = (_f16_chunk, f16_reduce) if wtype is Q.F16 else (_bf16_chunk, _bf16_reduce)
    acc, hi = tile.of("acc"), tile.of("hi")
    # the float64 sum the tail starts from: F16's reduced lanes; BF16's two vectors added to 0
    start = f"(double)L({acc})" if wtype is Q.F16 else f"k_dadd(k_dadd(0.0, (double)L({acc})), (double)L({hi}))"
    xi = ROUND[wtype].format(v="LD(float, x, (long)row * K + i)")
    wi = WEIGHT[wtype].format(h="LDB(u16, w, 2 * ((long)n * K + i))")
    tail = f"""\
double sumf = {start};
#pragma unroll 1
for (int i = MAIN; i < K; ++i) sumf = k_dadd(sumf, (double)k_mul({xi}, {wi}));
ST(float, y, (long)row * N + n, k_d2f(sumf));"""
    return lanes_kernel(wtype, n_out, k, tile, chunk=chunk(tile), lanes_done=lanes_done(tile), tail=tail)


def lanes_kernel(wtype: Q, n_out: int, k: int, tile: Tile, *, chunk: str, lanes_done: str, tail: str,
                 enums: str = "") -> Kernel:
    """The kernel every float weight shares (module docstring; gemv_f32.py's too): one warp per
    output, lanes `acc` and `hi` zeroed, `chunk` per 64 values up to MAIN, `lanes_done` reducing
    them, then lane 0 runs `tail` per row (it stores y). `enums`: more constants after N, K, MAIN."""
    acc, hi = tile.of("acc"), tile.of("hi")
    body = f"""\
{tile.declare("float", "acc")}{tile.declare("float", "hi")}\
  LANE(float, other);
  enum {{ N = {n_out}, K = {k}, MAIN = {k - k % FLOAT_CHUNK}{enums} }};
BODY
{tile.top}\
  const int n = BX * {GEMV_WARPS} + WARP;
  if (n < N) {{
    LANES {{
{tile.each_row(f"L({acc}) = 0.0f; L({hi}) = 0.0f;", 6)}\
    }}
    for (int c = 0; c < MAIN; c += {FLOAT_CHUNK}) {{
{chunk}\
    }}
{lanes_done}\
    LANES {{
      if (LANE_ID == 0) {{
{tile.each_row(tail, 8)}\
      }}
    }}
  }}
"""
    return tile.kernel(wtype, n_out, k, -(-n_out // GEMV_WARPS), False, body, activations=ACTIVATIONS)


def _f16_chunk(tile: Tile) -> str:
    """Thread t's lanes t and t + 32 of one chunk, for every row."""
    acc, hi = tile.of("acc"), tile.of("hi")
    step = f"""\
const long xr = (long)row * K + c + LANE_ID;
L({acc}) = k_fma(k_h2f(k_f2h(LD(float, x, xr))), w0, L({acc}));
L({hi}) = k_fma(k_h2f(k_f2h(LD(float, x, xr + 32))), w1, L({hi}));"""
    return f"""\
      LANES {{
        const long wr = 2 * ((long)n * K + c + LANE_ID);
        const float w0 = k_h2f(LDB(u16, w, wr)), w1 = k_h2f(LDB(u16, w, wr + 64));
{tile.each_row(step, 8)}\
      }}
"""


def f16_reduce(tile: Tile) -> str:
    """t16's inner pair in each thread, the rest of the tree by the butterfly."""
    acc = tile.of("acc")
    return f"""\
    LANES {{
{tile.each_row(f"L({acc}) = k_add(L({acc}), L({tile.of('hi')}));", 6)}\
    }}
{tile.each_row(butterfly(acc, f"k_add(L({acc}), L(other))", (16, 8, 4, 2, 1), 0), 4)}\
"""


def _bf16_chunk(tile: Tile) -> str:
    """Thread t's lane: values c + 2t + 1, then c + 2t, for every row (vdpbf16ps's order)."""
    acc = tile.of("acc")
    step = f"""\
const long xr = (long)row * K + c + 2 * LANE_ID;
const float x0 = k_flush(k_bf16_round(LD(float, x, xr))), x1 = k_flush(k_bf16_round(LD(float, x, xr + 1)));
L({acc}) = k_flush(k_fma(x1, w1, L({acc})));
L({acc}) = k_flush(k_fma(x0, w0, L({acc})));"""
    return f"""\
      LANES {{
        const u32 wp = LDB(u32, w, 2 * ((long)n * K + c) + 4 * LANE_ID);
        const float w0 = k_flush(k_bits2f(wp << 16)), w1 = k_flush(k_bits2f(wp & 0xffff0000u));
{tile.each_row(step, 8)}\
      }}
"""


def _bf16_reduce(tile: Tile) -> str:
    """Each half warp's 16 lanes reduced (xor 8, 4, 2, 1); every lane also gets the other half's sum
    (lane 0: vector 1's, in `hi`)."""
    acc, hi = tile.of("acc"), tile.of("hi")
    reduce = butterfly(acc, f"k_add(L({acc}), L(other))", (8, 4, 2, 1), 0) + f"\nSHFL_XOR({hi}, {acc}, 16);"
    return tile.each_row(reduce, 4)
