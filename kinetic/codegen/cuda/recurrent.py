"""The CUDA kernels of the recurrent families: the short convolution over each row's rolling state
(lfm2), and Qwen3.5's stateless `sigmoid` (its gates) and `head_columns` (each head's query and gate
halves of one projection).

Owns: `short_conv(channels, taps)` (ggml_ssm_conv as numerics.recurrent.short_conv_row sums it: taps
in ascending order from 0, chunks of 16 then 8 as rounded products added one after another, each
remaining tap one fma; the state a row leaves is its window's last taps - 1 values), `sigmoid(width)`
(ggml_sigmoid, 1 / (1 + expf(-x)), with the C library's expf as prelude.py's `k_expf_libc` computes
it, every step one f32 rounding as numerics.recurrent.sigmoid's) and
`head_columns(n_head, stride, start, count)` (bits copied as they are), each specialized to its
shape. Does not own their meaning (kinetic/ir/reference.py, kinetic/ir/delta_reference.py,
kinetic/ir/numerics/recurrent.py), which state each row starts from (the runtime stages it:
pass_states.py), compiling or launching. Mamba-2's `ssm_scan` and Gated DeltaNet's `delta_rule` have
no kernel yet (their softplus needs the C library's logf, which no device kernel has): the renderer
refuses them by name.

The recurrence: one thread per channel walks the pass's rows in order (a parent comes before its
children), each row starting from its parent row's state (`after`, written by the same thread
earlier in the launch) or, for a row without a parent in the pass, from its sequence's committed
state (`committed`, staged by the host), so a row's output and state depend only on its own path: a
batch gives each row what it gets alone and a tree row what its path gives. The stateless kernels
compute each value from its own input alone.
"""

from __future__ import annotations

from kinetic.codegen.cuda.kernel import Kernel, Param

THREADS = 256  # one thread per value of a row
# numerics.recurrent.softplus of the float v: v above 20 passes through, else logf(1 + expf(v)) with
# the C library's functions (prelude.py's k_expf_libc, logf.py's k_logf_libc)
SOFTPLUS = "({v} > 20.0f ? {v} : k_logf_libc(k_add(1.0f, k_expf_libc({v}))))"


def _blocks(width: int) -> int:
    return -(-width // THREADS)


def _unary(name: str, width: int, value: str) -> Kernel:
    """out f32 [rows, width] = `value` (a C expression of the float v) per value v of x f32 [rows, width]."""
    params = (Param("x", "const float*"), Param("out", "float*"))
    body = f"""\
  enum {{ W = {width} }};
BODY
  LANES {{
    const int i = BX * {THREADS} + TID;
    if (i < W) {{
      const long at = (long)BY * W + i;
      const float v = LD(float, x, at);
      ST(float, out, at, {value});
    }}
  }}
"""
    return Kernel(f"{name}_w{width}", "pointwise", THREADS, _blocks(width), params, body)


def sigmoid(width: int) -> Kernel:
    """out f32 [rows, width] = 1 / (1 + expf(0 - x)) per value of x f32 [rows, width] (the reference's
    `0 - x`: a negated zero stays +0 as numpy's does)."""
    return _unary("sigmoid", width, "k_div(1.0f, k_add(1.0f, k_expf_libc(k_sub(0.0f, v))))")


def head_columns(n_head: int, stride: int, start: int, count: int) -> Kernel:
    """out f32 [rows, n_head*count]: per head h, columns h*stride + start .. + count - 1 of x f32
    [rows, n_head*stride], the heads side by side; the values' bits copied as they are."""
    width = n_head * count
    params = (Param("x", "const float*"), Param("out", "float*"))
    body = f"""\
  enum {{ W_IN = {n_head * stride}, STRIDE = {stride}, START = {start}, COUNT = {count}, W = {width} }};
BODY
  LANES {{
    const int i = BX * {THREADS} + TID;
    if (i < W) {{
      const long src = (long)BY * W_IN + (i / COUNT) * STRIDE + START + i % COUNT;
      ST(u32, out, (long)BY * W + i, LD(u32, x, src));
    }}
  }}
"""
    name = f"head_columns_h{n_head}_s{stride}_o{start}_c{count}"
    return Kernel(name, "gather", THREADS, _blocks(width), params, body)


def _conv_taps(taps: int) -> str:
    """numerics.recurrent.short_conv_row's order over win[] and wt[]: chunks of 16 then 8 as rounded
    products added in tap order, then one fma a tap."""
    lines, tap = [], 0
    while taps - tap >= 16:
        lines += [f"acc = k_add(acc, k_mul(win[{t}], wt[{t}]));" for t in range(tap, tap + 16)]
        tap += 16
    if taps - tap >= 8:
        lines += [f"acc = k_add(acc, k_mul(win[{t}], wt[{t}]));" for t in range(tap, tap + 8)]
        tap += 8
    lines += [f"acc = k_fma(win[{t}], wt[{t}], acc);" for t in range(tap, taps)]
    return "\n".join(" " * 8 + line for line in lines)


def short_conv(channels: int, taps: int) -> Kernel:
    """out f32 [rows, C]: each channel's dot of its taps (w f32 [C, K]) with its window along the row's
    path, the state's K - 1 values then the row's own (x f32 [rows, C]). Row r starts from after[parent]
    when parents[r] >= 0, else from committed[r] (f32 [rows, (K-1)*C], the state laid out as rs[K-1, C]);
    it leaves its window's last K - 1 values in after[r]. n_rows: the pass's rows (one block row walks
    them all; the grid is channels only)."""
    params = (Param("x", "const float*"), Param("w", "const float*"), Param("committed", "const float*"),
              Param("parents", "const int*"), Param("after", "float*"), Param("out", "float*"),
              Param("n_rows", "int"))
    body = f"""\
  enum {{ C = {channels}, K = {taps}, SW = {(taps - 1) * channels} }};
BODY
  LANES {{
    const int c = BX * {THREADS} + TID;
    if (c < C) {{
      float wt[K];
      for (int t = 0; t < K; ++t) wt[t] = LD(float, w, (long)c * K + t);
      for (int r = 0; r < n_rows; ++r) {{
        const int parent = LD(int, parents, r);
        float win[K];
        for (int t = 0; t < K - 1; ++t)
          win[t] = parent >= 0 ? LD(float, after, (long)parent * SW + (long)t * C + c)
                               : LD(float, committed, (long)r * SW + (long)t * C + c);
        win[K - 1] = LD(float, x, (long)r * C + c);
        float acc = 0.0f;
{_conv_taps(taps)}
        ST(float, out, (long)r * C + c, acc);
        for (int t = 0; t < K - 1; ++t) ST(float, after, (long)r * SW + (long)t * C + c, win[t + 1]);
      }}
    }}
  }}
"""
    return Kernel(f"short_conv_c{channels}_k{taps}", "pointwise", THREADS, _blocks(channels), params, body)


def softplus(width: int) -> Kernel:
    """out f32 [rows, width] = numerics.recurrent.softplus per value of x f32 [rows, width]: the scan's
    and the delta rule's step sizes, written out on its own."""
    return _unary("softplus", width, SOFTPLUS.format(v="v"))
