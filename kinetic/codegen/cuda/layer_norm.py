"""CUDA's layer norm (the `layer_norm` op of encoder models): one block of one warp per row.

Owns the kernel and its order, the reference's (kinetic/ir/numerics/layer_norm.py, ggml_norm on
x86 with AVX-512): lane 0 sums the row in float64 in order and rounds it to f32, mean = that / n in
f32; then the squares of x - mean, 16 at a time, each chunk reduced as _mm512_reduce_add_ps does
(halves 16 -> 8 -> 4, then (l0 + l2) + (l1 + l3)) and added into a float64 sum, the last n % 16
squares one by one; variance = f32(sum / n); scale = 1 / sqrtf(variance + eps). Every lane then
writes (x - mean) * scale * weight for its columns. The reductions run on one lane because their
order is a chain; a row is never split, so a row's bits never depend on the pass (batch invariance).
Does not own the bias (an add_bias launch after it) or where it launches (plan.py).
"""

from __future__ import annotations

from kinetic.codegen.cuda.kernel import Kernel, Param, f32_literal, name_tag

THREADS = 32


def _square(i: str) -> str:
    """The f32 square of x[base + c + i] - mean."""
    return f"k_mul(k_sub(LD(float, x, base + c + {i}), mean), k_sub(LD(float, x, base + c + {i}), mean))"


def layer_norm(width: int, eps: float, weighted: bool = True) -> Kernel:
    """out [rows, width] = (x - mean) / sqrt(var + eps) (then times weight [width]); one block per row."""
    params = [Param("x", "const float*")] + ([Param("weight", "const float*")] if weighted else [])
    params.append(Param("out", "float*"))
    quads = ", ".join(f"k_add(k_add({_square(f'{l} + 12')}, {_square(f'{l} + 4')}), "
                      f"k_add({_square(f'{l} + 8')}, {_square(str(l))}))" for l in range(4))
    weigh = "v = k_mul(v, LD(float, weight, i));" if weighted else ""
    body = f"""\
  SHARED(float, stats, 2);
  enum {{ W = {width} }};
BODY
  LANES {{
    if (TID == 0) {{
      const long base = (long)BY * W;
      double sum = 0.0;
      for (int i = 0; i < W; ++i) sum = k_dadd(sum, (double)LD(float, x, base + i));
      const float mean = k_div(k_d2f(sum), (float)W);
      double total = 0.0;
      int c = 0;
      for (; c + 16 <= W; c += 16) {{
        const float q[4] = {{{quads}}};
        total = k_dadd(total, (double)k_add(k_add(q[0], q[2]), k_add(q[1], q[3])));
      }}
      for (int i = c; i < W; ++i) {{
        const float d = k_sub(LD(float, x, base + i), mean);
        total = k_dadd(total, (double)k_mul(d, d));
      }}
      const float variance = k_d2f(k_ddiv(total, (double)W));
      stats[0] = mean;
      stats[1] = k_div(1.0f, k_sqrt(k_add(variance, {f32_literal(eps)})));
    }}
  }}
  BARRIER();
  LANES {{
    const long base = (long)BY * W;
    for (int i = TID; i < W; i += {THREADS}) {{
      float v = k_mul(k_sub(LD(float, x, base + i), stats[0]), stats[1]);
      {weigh}
      ST(float, out, base + i, v);
    }}
  }}
"""
    name = f"layer_norm_w{width}_{'weighted' if weighted else 'plain'}_eps{name_tag(eps)}"
    return Kernel(name, "layer_norm", THREADS, 1, tuple(params), body, shared_bytes=8)
