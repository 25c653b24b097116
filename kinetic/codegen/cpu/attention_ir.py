"""Renders the attention score kernel: the dot products of one query head with a run of cached keys.

Owns: `render_scores(head_dim)`, LLVM IR for

    kin_attn_scores_hd{D}(q, k, out, stride, j0, j1):  out[j - j0] = dot_f16(q, key j)  for j in [j0, j1)

with q f32 [D] (values already rounded to f16), k the f16 cache at the head's first element (key j
at k + j * stride elements), in `numerics.dot_f16`'s order: 64 lanes, each the f32 sum over the
chunks of 64 of q*k (a product of two f16 values is exact in f32, so this is the reference's
f64-product-plus-lane rounded to f32), folded (l[t] + l[32+t]) + (l[16+t] + l[48+t]), then halves
16 -> 8 -> 4, then (l0 + l2) + (l1 + l3). Head dims that are not a multiple of 64 (whose tail the
reference adds in f64) are not rendered; the numba path (step_attention.py) handles them.

Why LLVM IR: numba keeps the per-key fold in memory (~20 ns a key); as <64 x float> vectors and
shuffles it is a few instructions.
"""

from __future__ import annotations

from kinetic.codegen.cpu.llvm_ir import Function, const_vec, module

PARAMS = [("ptr", "q"), ("ptr", "k"), ("ptr", "out"), ("i64", "stride"), ("i64", "j0"), ("i64", "j1")]


def _half(fn: Function, v: str, n: int, start: int) -> str:
    mask = const_vec("i32", range(start, start + n // 2))
    return fn.v(f"shufflevector <{n} x float> {v}, <{n} x float> poison, {mask}")


def _quarter(fn: Function, v: str, start: int) -> str:
    return fn.v(f"shufflevector <64 x float> {v}, <64 x float> poison, {const_vec('i32', range(start, start + 16))}")


def render_scores(head_dim: int) -> tuple[str, str]:
    if head_dim % 64 or head_dim <= 0:
        raise ValueError(f"the score kernel needs a head dim that is a multiple of 64, not {head_dim}")
    fn = Function(f"kin_attn_scores_hd{head_dim}", PARAMS)
    chunks = head_dim // 64
    qs = [fn.load("<64 x float>", fn.gep("%q", 256 * c), 4) for c in range(chunks)]

    def body(j: str, _carried: list[str]) -> list[str]:
        row = fn.gep("%k", fn.v(f"mul i64 {j}, %stride"), "i16")
        lanes = None
        for c in range(chunks):
            h = fn.load("<64 x half>", fn.gep(row, 64 * c, "i16"), 2)
            p = fn.v(f"fmul <64 x float> {qs[c]}, {fn.v(f'fpext <64 x half> {h} to <64 x float>')}")
            lanes = p if lanes is None else fn.v(f"fadd <64 x float> {lanes}, {p}")
        a, b, c_, d = (_quarter(fn, lanes, s) for s in (0, 16, 32, 48))
        v16 = fn.v(f"fadd <16 x float> {fn.v(f'fadd <16 x float> {a}, {c_}')}, {fn.v(f'fadd <16 x float> {b}, {d}')}")
        v8 = fn.v(f"fadd <8 x float> {_half(fn, v16, 16, 8)}, {_half(fn, v16, 16, 0)}")
        v4 = fn.v(f"fadd <4 x float> {_half(fn, v8, 8, 4)}, {_half(fn, v8, 8, 0)}")
        e = [fn.v(f"extractelement <4 x float> {v4}, i64 {i}") for i in range(4)]
        total = fn.v(f"fadd float {fn.v(f'fadd float {e[0]}, {e[2]}')}, {fn.v(f'fadd float {e[1]}, {e[3]}')}")
        fn.store("float", total, fn.gep("%out", fn.v(f"sub i64 {j}, %j0"), "float"), 4)
        return []

    fn.loop("%j0", "%j1", [], body)
    fn.do("ret void")
    return module([fn], []), fn.name


SOFTMAX_PARAMS = [("ptr", "scores"), ("ptr", "vis"), ("ptr", "v"), ("ptr", "out"),
                  ("i64", "stride"), ("i64", "first"), ("i64", "end"), ("i64", "scale_bits"), ("i64", "cap_bits")]


def _round_f16(fn: Function, v: str) -> str:
    h = fn.v(f"fptrunc <64 x float> {v} to <64 x half>")
    return fn.v(f"fpext <64 x half> {h} to <64 x float>")


def render_softmax(head_dim: int, softcap: bool) -> tuple[str, str]:
    """LLVM IR for the online softmax of one query head over keys [first, end):

        kin_attn_softmax_hd{D}[_cap](scores, vis, v, out, stride, first, end, scale_bits, cap_bits)

    scores f32 and vis u8 indexed j - first (vis 0: the row does not see key j), v the f16 cache
    of values at the head's first element, out f32 [D]; scale and cap are f32 bit patterns. Per
    visible key, in `numerics.attention_online`'s order: s = score * scale (then cap * tanhf(s));
    on a new maximum ms = expf(m - s), vs = 1, else ms = 1, vs = expf(s - m) (the C library's expf);
    acc = f16(acc * ms) (exact in f32: an f16 value times an f32), then acc = f16(f32(acc + v * vs)
    in f64); S = f32(S * ms + vs in f64). out = acc * (1/S), 0 where S is 0. The accumulator stays
    in registers; a key the row does not see leaves every value as it was (selects)."""
    if head_dim % 64 or head_dim <= 0:
        raise ValueError(f"the softmax kernel needs a head dim that is a multiple of 64, not {head_dim}")
    name = f"kin_attn_softmax_hd{head_dim}" + ("_cap" if softcap else "")
    fn = Function(name, SOFTMAX_PARAMS)
    chunks = head_dim // 64
    scale = fn.v(f"bitcast i32 {fn.v('trunc i64 %scale_bits to i32')} to float")
    cap = fn.v(f"bitcast i32 {fn.v('trunc i64 %cap_bits to i32')} to float")
    zeros = "zeroinitializer"

    def body(j: str, carried: list[str]) -> list[str]:
        m, total, accs = carried[0], carried[1], carried[2:]
        idx = fn.v(f"sub i64 {j}, %first")
        seen = fn.v(f"icmp ne i8 {fn.load('i8', fn.gep('%vis', idx))}, 0")
        s = fn.v(f"fmul float {fn.load('float', fn.gep('%scores', idx, 'float'), 4)}, {scale}")
        if softcap:
            s = fn.v(f"fmul float {cap}, {fn.v(f'call float @tanhf(float {s})')}")
        new_max = fn.v(f"fcmp ogt float {s}, {m}")
        arg = fn.v(f"select i1 {new_max}, float {fn.v(f'fsub float {m}, {s}')}, float {fn.v(f'fsub float {s}, {m}')}")
        e = fn.v(f"call float @expf(float {arg})")
        ms = fn.v(f"select i1 {new_max}, float {e}, float 1.0")
        vs = fn.v(f"select i1 {new_max}, float 1.0, float {e}")
        ms_v = fn.splat_value(64, "float", ms)
        vs_d = fn.splat_value(64, "double", fn.v(f"fpext float {vs} to double"))
        row = fn.gep("%v", fn.v(f"mul i64 {j}, %stride"), "i16")
        new = []
        for c in range(chunks):
            scaled = _round_f16(fn, fn.v(f"fmul <64 x float> {accs[c]}, {ms_v}"))
            h = fn.load("<64 x half>", fn.gep(row, 64 * c, "i16"), 2)
            vd = fn.v(f"fpext <64 x half> {h} to <64 x double>")
            summed = fn.v(f"fadd <64 x double> {fn.v(f'fpext <64 x float> {scaled} to <64 x double>')}, "
                          f"{fn.v(f'fmul <64 x double> {vd}, {vs_d}')}")
            acc = _round_f16(fn, fn.v(f"fptrunc <64 x double> {summed} to <64 x float>"))
            new.append(fn.v(f"select i1 {seen}, <64 x float> {acc}, <64 x float> {accs[c]}"))
        td = fn.v(f"fmul double {fn.v(f'fpext float {total} to double')}, {fn.v(f'fpext float {ms} to double')}")
        vs_one = fn.v(f"fpext float {vs} to double")
        t_new = fn.v(f"fptrunc double {fn.v(f'fadd double {td}, {vs_one}')} to float")
        m_new = fn.v(f"select i1 {new_max}, float {s}, float {m}")
        return [fn.v(f"select i1 {seen}, float {m_new}, float {m}"),
                fn.v(f"select i1 {seen}, float {t_new}, float {total}")] + new

    carried = [("float", "0xFFF0000000000000"), ("float", "0.0")] + [("<64 x float>", zeros)] * chunks
    finals = fn.loop("%first", "%end", carried, body)
    total = finals[1]
    is_zero = fn.v(f"fcmp oeq float {total}, 0.0")
    inv = fn.v(f"select i1 {is_zero}, float 0.0, float {fn.v(f'fdiv float 1.0, {total}')}")
    inv_v = fn.splat_value(64, "float", inv)
    for c in range(chunks):
        fn.store("<64 x float>", fn.v(f"fmul <64 x float> {finals[2 + c]}, {inv_v}"), fn.gep("%out", 256 * c), 4)
    fn.do("ret void")
    return module([fn], ["declare float @expf(float)", "declare float @tanhf(float)"]), fn.name
