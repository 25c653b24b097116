"""Reference numerics shared by the interpreter: activation quantization, matmul, norms, rotary,
activations, attention, layer norm. A package of eight modules, re-exported here, so `numerics.X` names them all.

The default semantics is ggml's CPU backend (llama.cpp b1-0c1e570, x86-64 with AVX2/FMA/AVX-512F and
AVX512-BF16, GCC) as it runs one decode row, reproduced bit for bit where docs/numerics.md says so; facts read
from ggml's sources, no code copied. In short:

* A quantized matmul first quantizes each activation row to 8 bits per block: Q8_0 (blocks of 32,
  d = amax/127 stored as f16, q = round-half-even(x * 127/amax)) for Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4
  weights; Q8_1 (Q8_0 plus s = f16(d * sum q)) for Q4_1/Q5_1, whose dot adds min * s per block;
  Q8_K (blocks of 256, iscale = -127/max with max the signed value of largest magnitude, d = 1/iscale
  kept in f32, q = min(127, round-half-even(iscale * x))) for k-quants and i-quants. F16 / BF16
  weights meet f16 / bf16-rounded activations, F32 weights f32 ones.
* Block-32, Q2_K .. Q6_K, IQ4_NL, IQ4_XS and MXFP4 dots follow the float order of the x86 kernels
  llama.cpp runs for a decode row exactly (exact integer lane sums, fma accumulation per block,
  ggml's horizontal sums; quant_dots.py for the newer types), and so do F16 / BF16 / F32 dots
  (ggml_vec_dot_f16 / _bf16 / _f32: 64-lane fma or vdpbf16ps accumulators, float_dot); other types
  are a float32 product of the dequantized operands (same integers, another summation order).
* RMS norm sums squares in float64 and scales in float32.
* Rotary: theta_scale = powf(base, -2/n_rot) and cosf/sinf from the C library, angles advanced by
  float32 products, divided by a rope_freqs factor, scaled linearly or by YaRN's ramp and magnitude;
  the rotation fused as fma(x0, cos, -(x1*sin)) / fma(x0, sin, x1*cos).
* SiLU uses ggml's vectorized exp (ggml_v_expf); GELU is ggml's f16 table built with tanhf, with
  x <= -10 -> 0 and x >= 10 -> x.
* Attention is ggml's CPU flash attention for one query row: q rounded to the cache type,
  ggml_vec_dot_f16's order for scores, keys in cache order with an online softmax using the C
  library's expf, an f16 value accumulator rounded after every key, S = fma(S, ms, vs), out = acc/S
  computed as acc * (1/S).

A row's result never depends on the other rows of the pass. The float path (activations="f32")
keeps plain float32 matmuls of dequantized weights.

Modules: floats (the C library's float functions, a true fma), activations (Q8_0 / Q8_1 / Q8_K and
f16 / bf16 rounding of activation rows), weights (a weight decoded once for its dot), dots (the
quantized and float dot products, `matmul`), pointwise (rms_norm, GELU, SiLU, softcap),
rotary (angles with every scaling, cos/sin, rotation), layer_norm (BERT's mean-and-variance norm),
recurrent (one row of a recurrent layer: short_conv_row, ssm_scan_row, softplus),
attention (dot_f16, attention_online).
"""

from kinetic.ir.numerics.activations import (
    FLOAT_WEIGHTS,
    Q8_0_USERS,
    Q8_1_USERS,
    activation_format,
    q8_1_sums,
    quantize_q8_0,
    quantize_q8_k,
    quantized_activations,
)
from kinetic.ir.numerics.attention import attention_online, dot_f16
from kinetic.ir.numerics.dots import FLOAT_CHUNK, float_dot, matmul
from kinetic.ir.numerics.floats import _LIBM, F32, fma_f32, libm_f32, logf, powf
from kinetic.ir.numerics.layer_norm import layer_norm
from kinetic.ir.numerics.pointwise import (
    GELU_COEF_A,
    SQRT_2_OVER_PI,
    expf_ggml,
    gelu_ggml,
    gelu_table,
    rms_norm,
    silu,
    softcap,
)
from kinetic.ir.numerics.recurrent import short_conv_row, softplus, ssm_scan_row
from kinetic.ir.numerics.rotary import Rotary, rope_angles, rope_cos_sin, rope_mscale, rope_rotate, yarn_corr_dims
from kinetic.ir.numerics.weights import LANE_TYPES, DequantizedWeight, block_minimums

__all__ = [
    "F32", "FLOAT_CHUNK", "FLOAT_WEIGHTS", "GELU_COEF_A", "LANE_TYPES", "Q8_0_USERS", "Q8_1_USERS",
    "SQRT_2_OVER_PI", "DequantizedWeight", "_LIBM", "activation_format", "attention_online",
    "block_minimums", "dot_f16", "expf_ggml", "float_dot", "fma_f32", "gelu_ggml", "gelu_table",
    "layer_norm", "libm_f32", "logf", "matmul", "powf", "q8_1_sums", "quantize_q8_0", "quantize_q8_k",
    "quantized_activations",
    "Rotary", "rms_norm", "rope_angles", "rope_cos_sin", "rope_mscale", "rope_rotate", "short_conv_row", "silu",
    "softcap", "softplus", "ssm_scan_row",
    "yarn_corr_dims",
]
