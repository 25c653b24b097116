"""GEMV and GEMM kernels for F32 weights, reading f32 activation rows, as CUDA C.

Owns: the F32 kernel text. Does not own the tile (gemv_tile.py), the entry points and the table of
formats (gemv.py), the kernel frame and F16 reduction it shares (gemv_float.py's lanes_kernel,
f16_reduce) or the meaning (kinetic/ir/numerics/dots.py `float_dot`, ggml_vec_dot_f32 as the reference
builds it). F32 weights are rare in GGUF files (the mixture-of-experts routers, `ffn_gate_inp`, and
small tensors llama-quantize keeps).

float_dot's F32 order is F16's (gemv_float.py) with fmas of unrounded values: 64 float lanes per
output, lane i summing fma(x, w, lane) over values 64c + i of the chunks c in order; t16 = (lanes
0..15 + lanes 32..47) + (lanes 16..31 + lanes 48..63), then _mm512_reduce_add_ps (one warp per
output: thread t holds lanes t and t + 32, the butterfly xor 16, 8, 4, 2, 1 is the rest of the tree).
The K % 64 last values are ggml's leftover loop as GCC vectorized it: up to the last whole 8 of them
the rounded products added one by one (total + f32(x*w)), then fmas; in float32 (sumf is a float in
ggml_vec_dot_f32), lane 0 does it. Rows never mix (gemv.py).
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cuda.gemv_float import f16_reduce, lanes_kernel
from kinetic.codegen.cuda.gemv_tile import Tile
from kinetic.codegen.cuda.kernel import Kernel
from kinetic.ir.numerics.dots import FLOAT_CHUNK

SUPPORTED = frozenset({Q.F32})
GEMM_ROWS = {Q.F32: 8}  # F16's tile: the same registers but for the rounding, which F32 has not


def f32_gemv(n_out: int, k: int, tile: Tile) -> Kernel:
    """The GEMV (tile rows None) or GEMM of F32 weights [n_out, k] against f32 rows. Parameters: w, x,
    y[, n_rows]."""
    main = k - k % FLOAT_CHUNK
    acc, hi = tile.of("acc"), tile.of("hi")
    xi, wi = "LD(float, x, (long)row * K + i)", "LD(float, w, (long)n * K + i)"
    tail = f"""\
float total = L({acc});
#pragma unroll 1
for (int i = MAIN; i < UNFUSED; ++i) total = k_add(total, k_mul({xi}, {wi}));
#pragma unroll 1
for (int i = UNFUSED; i < K; ++i) total = k_fma({xi}, {wi}, total);
ST(float, y, (long)row * N + n, total);"""
    step = f"""\
const long xr = (long)row * K + c + LANE_ID;
L({acc}) = k_fma(LD(float, x, xr), w0, L({acc}));
L({hi}) = k_fma(LD(float, x, xr + 32), w1, L({hi}));"""
    chunk = f"""\
      LANES {{
        const long wr = (long)n * K + c + LANE_ID;
        const float w0 = LD(float, w, wr), w1 = LD(float, w, wr + 32);
{tile.each_row(step, 8)}\
      }}
"""
    return lanes_kernel(Q.F32, n_out, k, tile, chunk=chunk, lanes_done=f16_reduce(tile), tail=tail,
                        enums=f", UNFUSED = {main + (k - main) // 8 * 8}")
