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
