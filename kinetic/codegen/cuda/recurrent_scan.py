"""The CUDA kernels of the recurrences with a matrix state: Mamba-2's selective scan (`ssm_scan`,
granitehybrid and falcon-h1) and Gated DeltaNet's delta rule (`delta_rule`, qwen35).

Owns: `ssm_scan(n_head, head_dim, n_group, d_state)`, numerics.recurrent.ssm_scan_row plus x * D as
kinetic/ir/reference.py's ssm_scan adds it: per head sp = softplus(dt) (the C library's expf and
logf), dA = expf(sp * A), x_dt = x * sp; each state value fma(s, dA, B * x_dt); y its dot with C over
whole chunks of 64 in 64 fma lanes, reduced as ggml's AVX-512 lanes are, then one fma per remaining
state; out = y + x * D. `delta_rule(n_k_head, n_v_head, head_dim)`, kinetic/ir/delta_reference.py's:
per value head the decay expf(softplus(alpha) * A) and the strength sigmoid(beta); the state row
scaled (one rounding each), delta = (v - dot(row, k)) * strength, the row updated by one fma a value,
out = dot(row, q) * (1 / sqrt(S)), both dots ggml_vec_dot_f32's (the lanes as above, then GCC's
vectorized tail: whole 16s and an 8 as rounded products added, the rest one fma each). Does not own
the meaning (kinetic/ir/numerics/recurrent.py) or which state a row starts from (pass_states.py).

One thread per row of the state (a scan channel's d_state values; a value row of a head's S x S
matrix) walks the pass's rows in order, each row starting from its parent's state (`after`, written
by the same thread earlier in the launch) or its sequence's committed state (`committed`), and
leaving its state in after[row]: a row's output and state depend only on its own path.
"""

from __future__ import annotations

import numpy as np

from kinetic.codegen.cuda.kernel import Kernel, Param, f32_literal, indent
from kinetic.codegen.cuda.recurrent import SOFTPLUS, THREADS

LANES = 64  # ggml's GGML_F32_STEP on AVX-512: 4 vectors of 16


def _dot(a: str, b: str, n: int, result: str, *, ggml_tail: bool) -> str:
    """C statements setting `result` to the dot of a(s) and b(s) for s < n (expressions in s) in the
    reference's order: 64 fma lanes over whole chunks (lane l: values l, l + 64, ...), ggml's
    reduction ((l_i + l_32+i) + (l_16+i + l_48+i), then halving 16 -> 8 -> 4, then (v0 + v2) + (v1 +
    v3)), then the tail (one fma each, or with ggml_tail, ggml_vec_dot_f32's: rounded products added
    up to the last whole 8 first). Each lane's chain is computed where the reduction needs it, so only
    a few partial sums are live at once (registers, no local array)."""
    main = n - n % LANES
    rest = n - main
    unfused = main + rest // 16 * 16 + (8 if rest % 16 >= 8 else 0) if ggml_tail else main

    def lane(l: str, var: str) -> str:  # lane l's chain (l an expression in qi, the quad)
        return f"float {var} = 0.0f; for (int s = {l}; s < {main}; s += {LANES}) {var} = k_fma({a}, {b}, {var});"

    def v16(i: str, var: str) -> str:
        lanes = " ".join(lane(f"{i} + {o}", f"l{o}") for o in (0, 32, 16, 48))
        return f"float {var}; {{ {lanes} {var} = k_add(k_add(l0, l32), k_add(l16, l48)); }}"

    def v8(j: str, var: str) -> str:
        return f"float {var}; {{ {v16(f'{j} + 8', 'hi')}\n  {v16(j, 'lo')}\n  {var} = k_add(hi, lo); }}"

    # the four quads in a loop kept rolled: one quad's 16 lane chains live at a time (registers)
    quads = f"""\
  float v0 = 0.0f, v1 = 0.0f, v2 = 0.0f, v3 = 0.0f;
#pragma unroll 1
  for (int qi = 0; qi < 4; ++qi) {{
    {v8("qi + 4", "a8")}
    {v8("qi", "b8")}
    const float quad = k_add(a8, b8);
    v0 = qi == 0 ? quad : v0; v1 = qi == 1 ? quad : v1; v2 = qi == 2 ? quad : v2; v3 = qi == 3 ? quad : v3;
  }}"""
    return f"""\
{{
{quads}
  {result} = k_add(k_add(v0, v2), k_add(v1, v3));
  for (int s = {main}; s < {n}; ++s)
    {result} = s < {unfused} ? k_add({result}, k_mul({a}, {b})) : k_fma({a}, {b}, {result});
}}"""


_STATE_PARAMS = (Param("committed", "const float*"), Param("parents", "const int*"), Param("after", "float*"),
                 Param("out", "float*"), Param("n_rows", "int"))


def _start(width: str) -> str:
    """`old(s)`: value s of this thread's state row as the row starts (its parent's after, or its
    committed state); `at` is the row's first value within a state of SW floats."""
    return f"""\
#define OLD(s) (parent >= 0 ? LD(float, after, (long)parent * SW + at + (s)) \\
                            : LD(float, committed, (long)r * SW + at + (s)))
#define NEW(s) LD(float, after, (long)r * SW + at + (s))
const long at = (long)ch * {width};
"""


def ssm_scan(n_head: int, head_dim: int, n_group: int, d_state: int) -> Kernel:
    """out f32 [rows, n_head*head_dim] from x (same shape), dt f32 [rows, n_head], A, D f32 [n_head]
    (weights), B, C f32 [rows, n_group*d_state]; the state rs[n_head*head_dim, d_state] as committed
    and after f32 [rows, n_head*head_dim*d_state]; one thread per channel (head, value)."""
    channels = n_head * head_dim
    params = (Param("x", "const float*"), Param("dt", "const float*"), Param("A", "const float*"),
              Param("B", "const float*"), Param("C", "const float*"), Param("D", "const float*"), *_STATE_PARAMS)
    step = f"""\
const int parent = LD(int, parents, r);
const float dtv = LD(float, dt, (long)r * NH + h);
const float sp = {SOFTPLUS.format(v="dtv")};
const float decay = k_expf_libc(k_mul(sp, a));
const float xv = LD(float, x, (long)r * CH + ch);
const float x_dt = k_mul(xv, sp);
const long bc = (long)r * NG * DS + (long)g * DS;
for (int s = 0; s < DS; ++s)
  ST(float, after, (long)r * SW + at + s, k_fma(OLD(s), decay, k_mul(LD(float, B, bc + s), x_dt)));
float y;
{_dot("NEW(s)", "LD(float, C, bc + s)", d_state, "y", ggml_tail=False)}
ST(float, out, (long)r * CH + ch, k_add(y, k_mul(xv, d)));"""
    body = f"""\
  enum {{ NH = {n_head}, HD = {head_dim}, NG = {n_group}, DS = {d_state}, CH = {channels}, SW = {channels * d_state} }};
BODY
  LANES {{
    const int ch = BX * {THREADS} + TID;
    if (ch < CH) {{
      const int h = ch / HD, g = h / (NH / NG);
      const float a = LD(float, A, h), d = LD(float, D, h);
{indent(_start("DS"), 6)}
      for (int r = 0; r < n_rows; ++r) {{
{indent(step, 8)}
      }}
#undef OLD
#undef NEW
    }}
  }}
"""
    name = f"ssm_scan_h{n_head}_d{head_dim}_g{n_group}_s{d_state}"
    return Kernel(name, "pointwise", THREADS, -(-channels // THREADS), params, body)


def delta_rule(n_k_head: int, n_v_head: int, head_dim: int) -> Kernel:
    """out f32 [rows, n_v_head*S] from q, k f32 [rows, n_k_head*S], v f32 [rows, n_v_head*S], alpha,
    beta f32 [rows, n_v_head], A f32 [n_v_head] (a weight); the state rs[n_v_head*S, S] as committed and
    after f32 [rows, n_v_head*S*S]; one thread per value row (head h, row j), reading key head
    h % n_k_head."""
    size = head_dim
    rows_total = n_v_head * size
    scale = f32_literal(np.float32(1) / np.float32(np.sqrt(np.float32(size))))
    params = (Param("q", "const float*"), Param("k", "const float*"), Param("v", "const float*"),
              Param("alpha", "const float*"), Param("beta", "const float*"), Param("A", "const float*"),
              *_STATE_PARAMS)
    step = f"""\
const int parent = LD(int, parents, r);
const float al = LD(float, alpha, (long)r * NV + h);
const float decay = k_expf_libc(k_mul({SOFTPLUS.format(v="al")}, a));
const float bt = LD(float, beta, (long)r * NV + h);
const float strength = k_div(1.0f, k_add(1.0f, k_expf_libc(k_sub(0.0f, bt))));
const long kq = (long)r * NK * S + (long)kh * S;
for (int s = 0; s < S; ++s) ST(float, after, (long)r * SW + at + s, k_mul(OLD(s), decay));
float kdot;
{_dot("NEW(s)", "LD(float, k, kq + s)", size, "kdot", ggml_tail=True)}
const float delta = k_mul(k_sub(LD(float, v, (long)r * NV * S + ch), kdot), strength);
for (int s = 0; s < S; ++s)
  ST(float, after, (long)r * SW + at + s, k_fma(LD(float, k, kq + s), delta, NEW(s)));
float qdot;
{_dot("NEW(s)", "LD(float, q, kq + s)", size, "qdot", ggml_tail=True)}
ST(float, out, (long)r * NV * S + ch, k_mul(qdot, {scale}));"""
    body = f"""\
  enum {{ NK = {n_k_head}, NV = {n_v_head}, S = {size}, ROWS = {rows_total}, SW = {rows_total * size} }};
BODY
  LANES {{
    const int ch = BX * {THREADS} + TID;
    if (ch < ROWS) {{
      const int h = ch / S, kh = h % NK;
      const float a = LD(float, A, h);
{indent(_start("S"), 6)}
      for (int r = 0; r < n_rows; ++r) {{
{indent(step, 8)}
      }}
#undef OLD
#undef NEW
    }}
  }}
"""
    name = f"delta_rule_k{n_k_head}_v{n_v_head}_s{size}"
    return Kernel(name, "pointwise", THREADS, -(-rows_total // THREADS), params, body)
