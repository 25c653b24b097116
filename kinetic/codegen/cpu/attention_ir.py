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

PARAMS = [("ptr", "q"), ("ptr", "k"), ("ptr", "out"), ("i64", "stride"), ("i64", "j0"), ("i64", "j1"),
          ("i64", "sstride")]


def _half(fn: Function, v: str, n: int, start: int) -> str:
    mask = const_vec("i32", range(start, start + n // 2))
    return fn.v(f"shufflevector <{n} x float> {v}, <{n} x float> poison, {mask}")


def _quarter(fn: Function, v: str, start: int) -> str:
    return fn.v(f"shufflevector <64 x float> {v}, <64 x float> poison, {const_vec('i32', range(start, start + 16))}")


def _fold(fn: Function, lanes: str) -> str:
    """dot_f16's reduction of its 64 lanes: (l[t] + l[32+t]) + (l[16+t] + l[48+t]), 16 -> 8 -> 4,
    then (l0 + l2) + (l1 + l3)."""
    a, b, c_, d = (_quarter(fn, lanes, s) for s in (0, 16, 32, 48))
    v16 = fn.v(f"fadd <16 x float> {fn.v(f'fadd <16 x float> {a}, {c_}')}, {fn.v(f'fadd <16 x float> {b}, {d}')}")
    v8 = fn.v(f"fadd <8 x float> {_half(fn, v16, 16, 8)}, {_half(fn, v16, 16, 0)}")
    v4 = fn.v(f"fadd <4 x float> {_half(fn, v8, 8, 4)}, {_half(fn, v8, 8, 0)}")
    e = [fn.v(f"extractelement <4 x float> {v4}, i64 {i}") for i in range(4)]
    return fn.v(f"fadd float {fn.v(f'fadd float {e[0]}, {e[2]}')}, {fn.v(f'fadd float {e[1]}, {e[3]}')}")


def render_scores(head_dim: int, heads: int = 1) -> tuple[str, str]:
    """kin_attn_scores_hd{D}_g{G}(q, k, out, stride, j0, j1, sstride): for G query heads (q f32
    [G, D]) sharing one KV head, out[g * sstride + j - j0] = dot_f16(q_g, key j); each key row is
    widened once for all G heads."""
    if head_dim % 64 or head_dim <= 0:
        raise ValueError(f"the score kernel needs a head dim that is a multiple of 64, not {head_dim}")
    fn = Function(f"kin_attn_scores_hd{head_dim}_g{heads}", PARAMS)
    chunks = head_dim // 64
    qs = [[fn.load("<64 x float>", fn.gep("%q", 4 * (g * head_dim + 64 * c)), 4) for c in range(chunks)]
          for g in range(heads)]

    def body(j: str, _carried: list[str]) -> list[str]:
        row = fn.gep("%k", fn.v(f"mul i64 {j}, %stride"), "i16")
        keys = [fn.v(f"fpext <64 x half> {fn.load('<64 x half>', fn.gep(row, 64 * c, 'i16'), 2)} to <64 x float>")
                for c in range(chunks)]
        idx = fn.v(f"sub i64 {j}, %j0")
        for g in range(heads):
            lanes = None
            for c in range(chunks):
                p = fn.v(f"fmul <64 x float> {qs[g][c]}, {keys[c]}")
                lanes = p if lanes is None else fn.v(f"fadd <64 x float> {lanes}, {p}")
            at = fn.v(f"add i64 {fn.v(f'mul i64 %sstride, {g}')}, {idx}")
            fn.store("float", _fold(fn, lanes), fn.gep("%out", at, "float"), 4)
        return []

    fn.loop("%j0", "%j1", [], body)
    fn.do("ret void")
    return module([fn], []), fn.name


SOFTMAX_PARAMS = [("ptr", "scores"), ("ptr", "vis"), ("ptr", "v"), ("ptr", "out"), ("ptr", "w"),
                  ("i64", "stride"), ("i64", "first"), ("i64", "end"), ("i64", "scale_bits"), ("i64", "cap_bits"),
                  ("i64", "sstride")]


def _round_f16(fn: Function, v: str) -> str:
    h = fn.v(f"fptrunc <64 x float> {v} to <64 x half>")
    return fn.v(f"fpext <64 x half> {h} to <64 x float>")


def heads_per_call(group: int, n_kv_head: int, threads: int) -> int:
    """How many query heads of one KV head an attention item carries: each key and value row is
    widened once for all of them and their softmax chains overlap, but a row's items must still
    give every thread work (decode has one row)."""
    fits = [g for g in range(1, min(group, 8) + 1) if group % g == 0 and n_kv_head * (group // g) >= threads]
    return max(fits, default=1)


def render_softmax(head_dim: int, heads: int, softcap: bool) -> tuple[str, str]:
    """LLVM IR for the online softmax of `heads` query heads of one row (sharing one KV head) over
    keys [first, end):

        kin_attn_softmax_hd{D}_g{G}[_cap](scores, vis, v, out, w, stride, first, end, scale_bits, cap_bits, sstride)

    scores f32 [G, sstride] and vis u8 indexed j - first (vis 0: the row does not see key j), v the
    f16 cache of values at the KV head's first element (key j at v + j * stride), out f32 [G, D],
    w scratch f32 [2, G, end - first]; scale and cap are f32 bit patterns. In
    `numerics.attention_online`'s order, per head and visible key: s = score * scale (then
    cap * tanhf(s)); on a new maximum ms = expf(m - s), vs = 1, else ms = 1, vs = expf(s - m) (the C
    library's expf); S = fma(S, ms, vs); acc = f16(acc * ms) (exact in f32: an f16 value times an
    f32) where ms is not 1, then acc = f16(fma(v, vs, acc)). out = acc * (1/S), 0 where S is 0.

    Two passes: the first runs the heads' scalar chains (max, expf, S) side by side and stores ms
    and vs; the second updates the accumulators, in registers, with no calls in between, for as many
    heads at a time as fit (256 floats), each value row widened once for them."""
    if head_dim % 64 or head_dim <= 0:
        raise ValueError(f"the softmax kernel needs a head dim that is a multiple of 64, not {head_dim}")
    name = f"kin_attn_softmax_hd{head_dim}_g{heads}" + ("_cap" if softcap else "")
    fn = Function(name, SOFTMAX_PARAMS)
    chunks = head_dim // 64
    scale = fn.v(f"bitcast i32 {fn.v('trunc i64 %scale_bits to i32')} to float")
    cap = fn.v(f"bitcast i32 {fn.v('trunc i64 %cap_bits to i32')} to float")
    n = fn.v("sub i64 %end, %first")
    w_vs = fn.gep("%w", fn.v(f"mul i64 {n}, {heads}"), "float")

    def pass_a(j: str, carried: list[str]) -> list[str]:
        idx = fn.v(f"sub i64 {j}, %first")
        seen = fn.v(f"icmp ne i8 {fn.load('i8', fn.gep('%vis', idx))}, 0")
        out = []
        for g in range(heads):
            m, total = carried[2 * g], carried[2 * g + 1]
            score_at = fn.v(f"add i64 {fn.v(f'mul i64 %sstride, {g}')}, {idx}")
            s = fn.v(f"fmul float {fn.load('float', fn.gep('%scores', score_at, 'float'), 4)}, {scale}")
            if softcap:
                s = fn.v(f"fmul float {cap}, {fn.v(f'call float @tanhf(float {s})')}")
            new_max = fn.v(f"fcmp ogt float {s}, {m}")
            arg = fn.v(f"select i1 {new_max}, float {fn.v(f'fsub float {m}, {s}')}, "
                       f"float {fn.v(f'fsub float {s}, {m}')}")
            e = fn.v(f"call float @expf(float {arg})")
            ms = fn.v(f"select i1 {new_max}, float {e}, float 1.0")
            vs = fn.v(f"select i1 {new_max}, float 1.0, float {e}")
            slot = fn.v(f"add i64 {fn.v(f'mul i64 {n}, {g}')}, {idx}")
            fn.store("float", ms, fn.gep("%w", slot, "float"), 4)
            fn.store("float", vs, fn.gep(w_vs, slot, "float"), 4)
            t_new = fn.v(f"call float @llvm.fma.f32(float {total}, float {ms}, float {vs})")
            m_new = fn.v(f"select i1 {new_max}, float {s}, float {m}")
            out += [fn.v(f"select i1 {seen}, float {m_new}, float {m}"),
                    fn.v(f"select i1 {seen}, float {t_new}, float {total}")]
        return out

    sums = fn.loop("%first", "%end", [("float", "0xFFF0000000000000"), ("float", "0.0")] * heads, pass_a)

    def pass_b(members: range, j: str, accs: list[str]) -> list[str]:
        idx = fn.v(f"sub i64 {j}, %first")
        seen = fn.v(f"icmp ne i8 {fn.load('i8', fn.gep('%vis', idx))}, 0")
        pre = fn.block
        work, join = fn.fresh("see"), fn.fresh("join")
        fn.do(f"br i1 {seen}, label %{work}, label %{join}")
        fn.label(work)
        row = fn.gep("%v", fn.v(f"mul i64 {j}, %stride"), "i16")
        scales = []
        for g in members:
            slot = fn.v(f"add i64 {fn.v(f'mul i64 {n}, {g}')}, {idx}")
            ms = fn.load("float", fn.gep("%w", slot, "float"), 4)
            vs = fn.load("float", fn.gep(w_vs, slot, "float"), 4)
            scales.append((fn.splat_value(64, "float", ms), fn.splat_value(64, "float", vs),
                           fn.v(f"fcmp une float {ms}, 1.0")))
        new = [""] * (len(members) * chunks)
        for c in range(chunks):
            h = fn.load("<64 x half>", fn.gep(row, 64 * c, "i16"), 2)
            vf = fn.v(f"fpext <64 x half> {h} to <64 x float>")
            for k, (ms_v, vs_v, rescale) in enumerate(scales):
                acc = accs[k * chunks + c]
                rounded = _round_f16(fn, fn.v(f"fmul <64 x float> {acc}, {ms_v}"))
                scaled = fn.v(f"select i1 {rescale}, <64 x float> {rounded}, <64 x float> {acc}")
                summed = fn.v(f"call <64 x float> @llvm.fma.v64f32(<64 x float> {vf}, <64 x float> {vs_v}, "
                              f"<64 x float> {scaled})")
                new[k * chunks + c] = _round_f16(fn, summed)
        end_work = fn.block
        fn.do(f"br label %{join}")
        fn.label(join)
        return [fn.v(f"phi <64 x float> [{acc}, %{pre}], [{upd}, %{end_work}]")
                for acc, upd in zip(accs, new, strict=True)]

    # the accumulators of as many heads as fit in registers (256 floats) at a time
    per_pass = max(1, 256 // head_dim)
    for g0 in range(0, heads, per_pass):
        members = range(g0, min(heads, g0 + per_pass))
        carried = [("<64 x float>", "zeroinitializer")] * (len(members) * chunks)
        finals = fn.loop("%first", "%end", carried, lambda j, accs, m=members: pass_b(m, j, accs))
        for k, g in enumerate(members):
            total = sums[2 * g + 1]
            is_zero = fn.v(f"fcmp oeq float {total}, 0.0")
            inv = fn.v(f"select i1 {is_zero}, float 0.0, float {fn.v(f'fdiv float 1.0, {total}')}")
            inv_v = fn.splat_value(64, "float", inv)
            for c in range(chunks):
                value = fn.v(f"fmul <64 x float> {finals[k * chunks + c]}, {inv_v}")
                fn.store("<64 x float>", value, fn.gep("%out", 4 * (g * head_dim + 64 * c)), 4)
    fn.do("ret void")
    declarations = ["declare float @expf(float)", "declare float @tanhf(float)",
                    "declare float @llvm.fma.f32(float, float, float)",
                    "declare <64 x float> @llvm.fma.v64f32(<64 x float>, <64 x float>, <64 x float>)"]
    return module([fn], declarations), fn.name
