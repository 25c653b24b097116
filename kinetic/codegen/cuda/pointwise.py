"""Norm, elementwise and rotary kernels as CUDA C.

Owns: RMS norm (with or without its weight), the elementwise ops (add, mul, scale, SiLU, GELU,
SwiGLU, GEGLU, the soft-cap through the C library's tanhf of cuda/tanhf.py), the bias add and rotary
embedding, each specialized to its width. Does not own: their meaning (kinetic/ir/reference.py and
kinetic/ir/numerics/) or compiling and launching.

* Elementwise and rotary kernels compute each value from its inputs alone, with the reference's
  roundings (SiLU through ggml's exp polynomial, GELU through ggml's f16 table, passed in as a
  65536-entry buffer; the rotation as fma(x0, cos, -(x1*sin)) and fma(x0, sin, x1*cos)), so they
  agree with the reference bit for bit. Rotary takes the cos/sin of each row's angles as inputs: the
  reference computes them with the C library's cosf/sinf, which a GPU does not have, so the runtime
  computes them once per position on the host (numerics.rope_cos_sin) and uploads them.
* RMS norm sums the f32 squares in float64 in a fixed tree (per thread a strided chain, then a
  butterfly per warp, then the warps in order), so it does not depend on the rows of the pass. The
  reference sums in float64 in numpy's pairwise order; both round the mean to float32, and they
  differ only if the two float64 sums straddle a float32 rounding boundary, which needs the sums to
  differ in their last float64 bits at a float32 midpoint (a chance near 2^-29 per group). The
  tests hold it to the reference within one float32 ulp and report exact equality where seen.
"""

from __future__ import annotations

import numpy as np

from kinetic.codegen.cuda.kernel import Kernel, Param, butterfly, f32_literal, int_sum, name_tag

POINTWISE_THREADS = 256
WARP_MASKS = (16, 8, 4, 2, 1)  # a butterfly over the 32 lanes of a warp
NORM_WARPS = 4
ROPE_THREADS = 128

# op -> (number of inputs, C expression of a and b); `factor` is filled in for scale
ELEMENTWISE = {
    "add": (2, "k_add(a, b)"),
    "mul": (2, "k_mul(a, b)"),
    "scale": (1, "k_mul(a, {factor})"),
    "silu": (1, "k_silu(a)"),
    "gelu": (1, "k_gelu(a, table)"),
    "swiglu": (2, "k_mul(k_silu(a), b)"),
    "geglu": (2, "k_mul(k_gelu(a, table), b)"),
    "add_bias": (2, "k_add(a, b)"),
    "softcap": (1, "k_mul({factor}, k_tanhf_libc(k_mul(a, {inverse})))"),  # factor: the cap
}
BROADCAST = {"add_bias"}  # ops whose second operand is one row [width] that every row reads


def elementwise(op: str, width: int, factor: float = 1.0, quantize: str | None = None) -> Kernel:
    """out [rows, width] = op(x, y) per value (a, b in the expressions). GELU kinds also take `table`
    (u16 [65536], the f16 bits of numerics.gelu_table()). quantize ("q8_0" or "q8_1", width a multiple
    of 32): also writes the row quantized for the matmul that reads it (xq, xd, Q8_1's xs), each warp
    one block of 32 values, as quantize.quantize(fmt, width) gives them from `out`."""
    if quantize and width % (256 if quantize == "q8_k" else 32):
        raise ValueError(f"a {quantize} row is whole blocks of {256 if quantize == 'q8_k' else 32} values, not {width}")
    if op not in ELEMENTWISE:
        raise NotImplementedError(f"no CUDA elementwise kernel for {op!r}")
    if quantize and op in BROADCAST:
        raise NotImplementedError(f"{op} writing a quantized row")
    n_in, expr = ELEMENTWISE[op]
    name = f"{op}_w{width}"
    if op in ("scale", "softcap"):
        expr = expr.format(factor=f32_literal(factor), inverse=f32_literal(np.float32(1) / np.float32(factor)))
        name += "_" + name_tag(factor)
    params = [Param("x", "const float*")]
    if n_in == 2:
        params.append(Param("y", "const float*"))
    if "table" in expr:
        params.append(Param("table", "const u16*"))
    params.append(Param("out", "float*"))
    params += quantized_params(quantize)
    b_load = f"const float b = LD(float, y, {'i' if op in BROADCAST else 'at'});" if n_in == 2 else ""
    blocks = -(-width // POINTWISE_THREADS)
    if quantize == "q8_k":
        body = _q8_k_body(width, expr, b_load)
        return Kernel(name + "_q8_k", "pointwise", POINTWISE_THREADS, blocks, tuple(params), body,
                      shared_bytes=Q8K_SHARED_BYTES)
    if quantize:
        body = QUANT_LANES[quantize] + f"""\
  enum {{ W = {width}, QK = {width}, QNB = {width // 32} }};
BODY
  const int c = (BX * {POINTWISE_THREADS}) / 32 + WARP;
  if (c < QNB) {{
    LANES {{
{_value_to_quantize("(long)BY * W + 32 * c + LANE_ID", expr, b_load, 6)}
    }}
{quantize_block(quantize)}  }}
"""
        name += f"_{quantize}"
        return Kernel(name, "pointwise", POINTWISE_THREADS, blocks, tuple(params), body)
    body = f"""\
  enum {{ W = {width} }};
BODY
  LANES {{
    const int i = BX * {POINTWISE_THREADS} + TID;
    if (i < W) {{
      const long at = (long)BY * W + i;
      const float a = LD(float, x, at);
      {b_load}
      ST(float, out, at, {expr});
    }}
  }}
"""
    return Kernel(name, "pointwise", POINTWISE_THREADS, blocks, tuple(params), body)


def rms_norm(width: int, eps: float, group: int = 0, weighted: bool = True, residual: bool = False,
             quantize: str | None = None) -> Kernel:
    """out [rows, width] = x / sqrt(mean(x^2 per group) + eps) (then times weight [group]): one block
    per group of a row (numerics.rms_norm; the weight multiplies afterwards, as ggml_mul does).

    residual: a fused chain for the residual stream, an add and the norm of its result in one launch:
    takes x and y, writes s = x + y (as the add kernel computes it) to `sum` and the norm of s to
    `out`, each value as the two kernels alone give it.

    quantize ("q8_0" or "q8_1", whole rows only): also writes the row quantized as the matmuls that
    read it take it (xq, xd and Q8_1's xs, as quantize.quantize(fmt, width) gives them from `out`),
    one warp per block of 32 values, so those matmuls need no quantizer launch of their own."""
    g = group or width
    if width % g:
        raise ValueError(f"rms_norm group {g} does not divide {width}")
    if quantize and (g != width or width % 32 or quantize not in ("q8_0", "q8_1")):
        raise ValueError(f"rms_norm can quantize whole rows of 32-value blocks to q8_0 or q8_1, not {quantize!r} "
                         f"(width {width}, group {g})")
    threads = 32 * NORM_WARPS
    params = [Param("x", "const float*")] + ([Param("y", "const float*")] if residual else [])
    if weighted:
        params.append(Param("weight", "const float*"))
    params += [Param("sum", "float*")] if residual else []
    params.append(Param("out", "float*"))
    params += quantized_params(quantize)
    value = "k_add(LD(float, x, base + i), LD(float, y, base + i))" if residual else "LD(float, x, base + i)"
    keep = "ST(float, sum, base + i, v);" if residual else ""
    weigh = "v = k_mul(v, LD(float, weight, i));" if weighted else ""
    partials = "k_dadd(k_dadd(part[0], part[1]), k_dadd(part[2], part[3]))"
    assert NORM_WARPS == 4, "the sum of the warp partials below is written for 4 warps"
    body = f"""\
  LANE(double, s);
  LANE(double, other);
  SHARED(double, part, {NORM_WARPS});
  enum {{ W = {width}, G = {g} }};
BODY
  LANES {{
    const long base = (long)BY * W + (long)BX * G;
    double acc = 0.0;
    for (int i = TID; i < G; i += {threads}) {{
      const float v = {value};
      {keep}
      acc = k_dadd(acc, (double)k_mul(v, v));
    }}
    L(s) = acc;
  }}
""" + "".join(f"  SHFL_XOR(other, s, {m}); LANES {{ L(s) = k_dadd(L(s), L(other)); }}\n" for m in WARP_MASKS) + """\
  LANES { if (LANE_ID == 0) part[WARP] = L(s); }
  BARRIER();
""" + (_normalize_quantized(value, weigh, partials, eps, quantize) if quantize else f"""\
  LANES {{
    const long base = (long)BY * W + (long)BX * G;
    const float mean = k_d2f(k_ddiv({partials}, (double)G));
    const float scale = k_div(1.0f, k_sqrt(k_add(mean, {f32_literal(eps)})));
    for (int i = TID; i < G; i += {threads}) {{
      float v = k_mul({value}, scale);
      {weigh}
      ST(float, out, base + i, v);
    }}
  }}
""")
    if quantize:
        body = QUANT_LANES[quantize] + f"  enum {{ QK = {width}, QNB = {width // 32} }};\n" + body
    kind = "weighted" if weighted else "plain"
    name = f"{'add_' if residual else ''}rms_norm_w{width}_g{g}_{kind}_eps{name_tag(eps)}"
    name += f"_{quantize}" if quantize else ""
    return Kernel(name, "norm", threads, width // g, tuple(params), body, shared_bytes=8 * NORM_WARPS)


QUANT_LANES = {"q8_0": "  LANE(float, scale);\n  LANE(float, qv);\n  LANE(float, amax);\n  LANE(float, otherf);\n",
                "q8_1": "  LANE(float, scale);\n  LANE(float, qv);\n  LANE(float, amax);\n  LANE(float, otherf);\n"
                        "  LANE(int, isum);\n  LANE(int, itmp);\n"}


def quantize_block(fmt: str) -> str:
    """Uniform code quantizing block `c` of row BY (width QK, QNB blocks) whose value lane i holds in
    L(qv): quantize._quantize_q8_0's operations (the amax butterfly, d rounded to f16, rint(v * 127 /
    amax), Q8_1's sum), writing xq, xd (and xs)."""
    sums = ""
    if fmt == "q8_1":
        sums = (int_sum("isum", (16, 8, 4, 2, 1), 4)
                + "    LANES { if (LANE_ID == 0) ST(float, xs, (long)BY * QNB + c,\n"
                  "        k_h2f(k_f2h(k_mul(k_div(L(amax), 127.0f), k_i2f(L(isum)))))); }\n")
    return f"""\
    LANES {{ L(amax) = k_abs(L(qv)); }}
{butterfly("amax", "k_max(L(amax), L(otherf))", (16, 8, 4, 2, 1), 4, other="otherf")}
    LANES {{
      const float inv = L(amax) != 0.0f ? k_div(127.0f, L(amax)) : 0.0f;
      const int q = k_rint(k_mul(L(qv), inv));
      ST(i8, xq, (long)BY * QK + 32 * c + LANE_ID, (i8)q);
      if (LANE_ID == 0) ST(float, xd, (long)BY * QNB + c, k_h2f(k_f2h(k_div(L(amax), 127.0f))));
      {"L(isum) = q;" if fmt == "q8_1" else ""}
    }}
{sums}"""


Q8K_LANES = ("  LANE(float, qv);\n  LANE(float, mag);\n  LANE(int, idx);\n  LANE(float, val);\n"
             "  LANE(float, omag);\n  LANE(int, oidx);\n  LANE(float, oval);\n"
             "  SHARED(float, wmag, 8);\n  SHARED(int, widx, 8);\n  SHARED(float, wval, 8);\n")
Q8K_SHARED_BYTES = 96


def q8_k_reduce() -> str:
    """Uniform code for a block of 256 threads holding one Q8_K super-block, thread t value t in L(qv):
    the value of largest magnitude (the first on ties) by a butterfly per warp on (|v|, index, v),
    each warp's winner to shared memory. A BARRIER and q8_k_store() follow."""
    steps = "".join(f"""\
  SHFL_XOR(omag, mag, {m}); SHFL_XOR(oidx, idx, {m}); SHFL_XOR(oval, val, {m});
  LANES {{
    if (L(omag) > L(mag) || (L(omag) == L(mag) && L(oidx) < L(idx))) {{
      L(mag) = L(omag); L(idx) = L(oidx); L(val) = L(oval);
    }}
  }}
""" for m in (16, 8, 4, 2, 1))
    return f"""\
  LANES {{ L(mag) = k_abs(L(qv)) > -1.0f ? k_abs(L(qv)) : -1.0f; L(idx) = TID; L(val) = L(qv); }}
{steps}  LANES {{ if (LANE_ID == 0) {{ wmag[WARP] = L(mag); widx[WARP] = L(idx); wval[WARP] = L(val); }} }}
"""


def q8_k_store(xq_at: str, xd_at: str) -> str:
    """After the barrier: the winner across the 8 warps (a total order: exact in any grouping), then
    quantize._quantize_q8_k's iscale = -127/max, q = min(127, rint(v * iscale)), d = 1/iscale, thread
    t's value to xq[xq_at], thread 0's d to xd[xd_at]."""
    return f"""\
  LANES {{
    float top = wmag[0], pick = wval[0];
    int at_top = widx[0];
    for (int w = 1; w < 8; ++w) {{
      if (wmag[w] > top || (wmag[w] == top && widx[w] < at_top)) {{ top = wmag[w]; at_top = widx[w]; pick = wval[w]; }}
    }}
    const float iscale = pick != 0.0f ? k_div(-127.0f, pick) : 0.0f;
    const int q = k_rint(k_mul(L(qv), iscale));
    ST(i8, xq, {xq_at}, (i8)(q < 127 ? q : 127));
    if (TID == 0) ST(float, xd, {xd_at}, pick != 0.0f ? k_div(1.0f, iscale) : 0.0f);
  }}
"""


def _value_to_quantize(at: str, expr: str, b_load: str, spaces: int) -> str:
    """Per-thread code: the elementwise value at `at`, written to `out` and kept in L(qv) for the
    quantizer that follows."""
    lines = [f"const long at = {at};", "const float a = LD(float, x, at);", b_load, f"const float v = {expr};",
             "ST(float, out, at, v);", "L(qv) = v;"]
    return "\n".join(" " * spaces + line for line in lines if line)


def _q8_k_body(width: int, expr: str, b_load: str) -> str:
    """An elementwise op whose block of 256 threads is one Q8_K super-block of the row: each thread
    one value, then q8_k_reduce() and q8_k_store()."""
    assert POINTWISE_THREADS == 256, "one block is one super-block of 256 values"
    return f"""\
{Q8K_LANES}  enum {{ W = {width}, NB = {width // 256} }};
BODY
  LANES {{
{_value_to_quantize("(long)BY * W + 256 * BX + TID", expr, b_load, 4)}
  }}
{q8_k_reduce()}  BARRIER();
{q8_k_store("(long)BY * W + 256 * BX + TID", "(long)BY * NB + BX")}"""


def quantized_params(fmt: str | None) -> list[Param]:
    if not fmt:
        return []
    if fmt == "q8_k":
        return [Param("xq", "i8*"), Param("xd", "float*")]
    if fmt not in ("q8_0", "q8_1"):
        raise ValueError(f"a fused quantizer writes q8_0, q8_1 or q8_k, not {fmt!r}")
    return [Param("xq", "i8*"), Param("xd", "float*")] + ([Param("xs", "float*")] if fmt == "q8_1" else [])


def _normalize_quantized(value: str, weigh: str, partials: str, eps: float, fmt: str) -> str:
    """The normalizing phase of rms_norm(quantize=fmt): warp w takes blocks w, w + 4, ... of 32 values,
    lane i value i of the block: the norm's value as the plain phase computes it, written to `out`,
    then quantize._quantize_q8_0's operations on it."""
    return f"""\
  LANES {{
    const float mean = k_d2f(k_ddiv({partials}, (double)G));
    L(scale) = k_div(1.0f, k_sqrt(k_add(mean, {f32_literal(eps)})));
  }}
  for (int c = WARP; c < QNB; c += {NORM_WARPS}) {{
    LANES {{
      const long base = (long)BY * W;
      const int i = 32 * c + LANE_ID;
      float v = k_mul({value}, L(scale));
      {weigh}
      ST(float, out, base + i, v);
      L(qv) = v;
    }}
{quantize_block(fmt)}  }}
"""


def rope(n_head: int, head_dim: int, n_rot: int, neox: bool, n_head_b: int = 0) -> Kernel:
    """out [rows, n_head*head_dim]: each head's first n_rot values rotated in pairs ((i, i + n_rot/2)
    for NeoX, (2i, 2i+1) otherwise) by the row's cos/sin [rows, n_rot/2], the rest copied.

    n_head_b: a fused pair, a layer's queries and keys in one launch: takes x, xb and writes out, outb
    (n_head and n_head_b heads, the same rotation tables), each value as rope() alone gives it."""
    if n_rot % 2 or not 0 < n_rot <= head_dim or head_dim % 2:
        raise ValueError(f"rope: n_rot {n_rot} does not fit head_dim {head_dim}")
    half = n_rot // 2
    pairs, pairs_b = n_head * (head_dim // 2), n_head_b * (head_dim // 2)
    first, second = ("i", f"i + {half}") if neox else ("2 * i", "2 * i + 1")
    params = [Param("x", "const float*")] + ([Param("xb", "const float*")] if n_head_b else [])
    params += [Param("cos_t", "const float*"), Param("sin_t", "const float*"), Param("out", "float*")]
    params += [Param("outb", "float*")] if n_head_b else []

    def rotate(src: str, dst: str, width: str, pair: str) -> str:
        return f"""\
      const int head = {pair} / (HEAD / 2), i = {pair} % (HEAD / 2);
      const long row = (long)BY * {width} + (long)head * HEAD;
      if (i < HALF) {{
        const int j0 = {first}, j1 = {second};
        const float x0 = LD(float, {src}, row + j0), x1 = LD(float, {src}, row + j1);
        const float c = LD(float, cos_t, (long)BY * HALF + i), s = LD(float, sin_t, (long)BY * HALF + i);
        ST(float, {dst}, row + j0, k_fma(x0, c, -k_mul(x1, s)));
        ST(float, {dst}, row + j1, k_fma(x0, s, k_mul(x1, c)));
      }} else {{
        ST(float, {dst}, row + 2 * i, LD(float, {src}, row + 2 * i));
        ST(float, {dst}, row + 2 * i + 1, LD(float, {src}, row + 2 * i + 1));
      }}
"""
    second_part = f"""\
    }} else if (pair < PAIRS + PAIRS_B) {{
      const int pb = pair - PAIRS;
{rotate("xb", "outb", "WB", "pb")}""" if n_head_b else ""
    body = f"""\
  enum {{ HEAD = {head_dim}, W = {n_head * head_dim}, WB = {max(n_head_b, 1) * head_dim}, HALF = {half},
         PAIRS = {pairs}, PAIRS_B = {pairs_b} }};
BODY
  LANES {{
    const int pair = BX * {ROPE_THREADS} + TID;
    if (pair < PAIRS) {{
{rotate("x", "out", "W", "pair")}{second_part}    }}
  }}
"""
    name = f"rope_h{n_head}{f'_h{n_head_b}' if n_head_b else ''}_d{head_dim}_r{n_rot}_{'neox' if neox else 'norm'}"
    return Kernel(name, "rope", ROPE_THREADS, -(-(pairs + pairs_b) // ROPE_THREADS), tuple(params), body)
