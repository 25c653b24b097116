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

from kinetic.codegen.cpu import expf_ir
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


ACCUMULATORS = ("f16", "f32")  # the value accumulator's type: "key_chain_f16" or "key_chain_f16_acc32"


def _round_f16(fn: Function, v: str) -> str:
    h = fn.v(f"fptrunc <64 x float> {v} to <64 x half>")
    return fn.v(f"fpext <64 x half> {h} to <64 x float>")


def _stored(fn: Function, v: str, accumulator: str) -> str:
    """An accumulator step's value as the accumulator keeps it: rounded to f16, or the f32 as is."""
    return _round_f16(fn, v) if accumulator == "f16" else v


def _rescale(fn: Function, accs: list[str], scales: list[tuple[str, str, str]], chunks: int,
             accumulator: str) -> list[str]:
    """acc = f16(acc * ms) (f32 accumulator: acc * ms) for the heads whose ms is not 1, behind a
    branch taken only when one of them has a new maximum (rarely, after the first keys): the common
    key skips a multiply and two conversions per 16 values."""
    pre = fn.block
    work, join = fn.fresh("rescale"), fn.fresh("rescaled")
    any_new = scales[0][2]
    for _ms, _vs, flag in scales[1:]:
        any_new = fn.v(f"or i1 {any_new}, {flag}")
    fn.do(f"br i1 {any_new}, label %{work}, label %{join}")
    fn.label(work)
    scaled = []
    for k, (ms_v, _vs, flag) in enumerate(scales):
        for c in range(chunks):
            acc = accs[k * chunks + c]
            rounded = _stored(fn, fn.v(f"fmul <64 x float> {acc}, {ms_v}"), accumulator)
            scaled.append(fn.v(f"select i1 {flag}, <64 x float> {rounded}, <64 x float> {acc}"))
    end_work = fn.block
    fn.do(f"br label %{join}")
    fn.label(join)
    return [fn.v(f"phi <64 x float> [{acc}, %{pre}], [{new}, %{end_work}]")
            for acc, new in zip(accs, scaled, strict=True)]


def heads_per_call(group: int, n_kv_head: int, threads: int) -> int:
    """How many query heads of one KV head an attention item carries: each key and value row is
    widened once for all of them and their softmax chains overlap, but a row's items must still
    give every thread work (decode has one row)."""
    fits = [g for g in range(1, min(group, 8) + 1) if group % g == 0 and n_kv_head * (group // g) >= threads]
    return max(fits, default=1)


class _PassA:
    """The softmax's first pass (see render_softmax): per head, the running max m and sum S over
    the keys, L keys a block, storing ms and vs of every key to w (visible or not; pass B skips the
    keys the row does not see)."""

    def __init__(self, fn: Function, heads: int, softcap: bool, lanes: int, vector_expf: bool, n: str):
        self.fn, self.heads, self.softcap, self.lanes, self.n = fn, heads, softcap, lanes, n
        self.vector_expf = vector_expf
        self.vf = f"<{lanes} x float>"
        scale = fn.v(f"bitcast i32 {fn.v('trunc i64 %scale_bits to i32')} to float")
        self.scale = fn.splat_value(lanes, "float", scale)
        self.cap = fn.v(f"bitcast i32 {fn.v('trunc i64 %cap_bits to i32')} to float")
        self.w_vs = fn.gep("%w", fn.v(f"mul i64 {n}, {heads}"), "float")

    def run(self) -> list[str]:
        """[m, S] per head after every key: full blocks, then the masked last block if any."""
        fn = self.fn
        full = fn.v(f"and i64 {self.n}, {-self.lanes}")
        start = [("float", "0xFFF0000000000000"), ("float", "0.0")] * self.heads
        carried = fn.loop(0, full, start, lambda idx, c: self.block(idx, c, None), step=self.lanes)
        pre, tail, join = fn.block, fn.fresh("tail"), fn.fresh("join")
        fn.do(f"br i1 {fn.v(f'icmp slt i64 {full}, {self.n}')}, label %{tail}, label %{join}")
        fn.label(tail)
        ends = self.block(full, carried, expf_ir.lane_mask(fn, full, self.n, self.lanes))
        end_tail = fn.block
        fn.do(f"br label %{join}")
        fn.label(join)
        return [fn.v(f"phi float [{c}, %{pre}], [{e}, %{end_tail}]") for c, e in zip(carried, ends, strict=True)]

    def _load(self, elem: str, ptr: str, mask: str | None, align: int) -> str:
        if mask is None:
            return self.fn.load(f"<{self.lanes} x {elem}>", ptr, align)
        return expf_ir.masked_load(self.fn, elem, self.lanes, ptr, mask, align)

    def _store(self, value: str, ptr: str, mask: str | None) -> None:
        if mask is None:
            self.fn.store(self.vf, value, ptr, 4)
        else:
            expf_ir.masked_store(self.fn, "float", self.lanes, value, ptr, mask, 4)

    def _lanes_map(self, v: str, call) -> str:
        """A scalar function applied lane by lane: call(scalar) -> scalar."""
        fn, out = self.fn, "poison"
        for k in range(self.lanes):
            x = fn.v(f"extractelement {self.vf} {v}, i64 {k}")
            out = fn.v(f"insertelement {self.vf} {out}, float {call(x)}, i64 {k}")
        return out

    def _softcap(self, x: str) -> str:
        return self.fn.v(f"fmul float {self.cap}, {self.fn.v(f'call float @tanhf(float {x})')}")

    def _expf(self, x: str) -> str:
        if self.vector_expf:
            return expf_ir.emit_expf(self.fn, x, self.lanes)
        return self._lanes_map(x, lambda e: self.fn.v(f"call float @expf(float {e})"))

    def _maxima(self, s: str, seen: str, m: str) -> tuple[str, str]:
        """The running maximum before each key of the block, and after the block, from m before it:
        the chain m = (s > m and seen) ? s : m as a scan. Its step keeps the left operand unless the
        right one is greater, an associative rule on non-NaN values (a tie keeps the earlier value,
        so even -0 versus +0 comes out as the chain has it); keys not seen and NaN scores, which the
        chain never takes, enter as -inf, which it never takes either. log2(L) steps of a shift."""
        fn, vf, lanes = self.fn, self.vf, self.lanes
        take = fn.v(f"and <{lanes} x i1> {seen}, {fn.v(f'fcmp ord {vf} {s}, zeroinitializer')}")
        scan = fn.v(f"select <{lanes} x i1> {take}, {vf} {s}, {vf} splat (float 0xFFF0000000000000)")
        shift = 1
        while shift < lanes:  # lane k: the maximum of lanes k - 2 shift + 1 .. k
            mask = const_vec("i32", [lanes] * shift + list(range(lanes - shift)))
            left = fn.v(f"shufflevector {vf} {scan}, {vf} splat (float 0xFFF0000000000000), {mask}")
            scan = self._keep_left(left, scan)
            shift *= 2
        after = self._keep_left(fn.splat_value(lanes, "float", m), scan)  # lane k: the maximum after key k
        ins = fn.v(f"insertelement {vf} poison, float {m}, i64 0")
        shift_in = const_vec("i32", [0] + list(range(lanes, 2 * lanes - 1)))  # m, then lanes 0 .. L-2 of after
        before = fn.v(f"shufflevector {vf} {ins}, {vf} {after}, {shift_in}")
        return before, fn.v(f"extractelement {vf} {after}, i64 {lanes - 1}")

    def _keep_left(self, left: str, right: str) -> str:
        higher = self.fn.v(f"fcmp ogt {self.vf} {right}, {left}")
        return self.fn.v(f"select <{self.lanes} x i1> {higher}, {self.vf} {right}, {self.vf} {left}")

    def block(self, idx: str, carried: list[str], mask: str | None) -> list[str]:
        """Keys idx .. idx + L - 1 (those under the mask): each head's maxima in key order, the
        block's expf arguments (m - s on a new maximum, else s - m, with m the maximum before the
        key), one expf, then S = fma(S, ms, vs) in key order."""
        fn, vf, lanes = self.fn, self.vf, self.lanes
        seen = fn.v(f"icmp ne <{lanes} x i8> {self._load('i8', fn.gep('%vis', idx), mask, 1)}, zeroinitializer")
        out = []
        for g in range(self.heads):
            m, total = carried[2 * g], carried[2 * g + 1]
            at = fn.v(f"add i64 {fn.v(f'mul i64 %sstride, {g}')}, {idx}")
            s = fn.v(f"fmul {vf} {self._load('float', fn.gep('%scores', at, 'float'), mask, 4)}, {self.scale}")
            if self.softcap:
                s = self._lanes_map(s, self._softcap)
            before, m = self._maxima(s, seen, m)
            new_max = fn.v(f"fcmp ogt {vf} {s}, {before}")
            arg = fn.v(f"select <{lanes} x i1> {new_max}, {vf} {fn.v(f'fsub {vf} {before}, {s}')}, "
                       f"{vf} {fn.v(f'fsub {vf} {s}, {before}')}")
            e = self._expf(arg)
            ms = fn.v(f"select <{lanes} x i1> {new_max}, {vf} {e}, {vf} splat (float 1.0)")
            vs = fn.v(f"select <{lanes} x i1> {new_max}, {vf} splat (float 1.0), {vf} {e}")
            slot = fn.v(f"add i64 {fn.v(f'mul i64 {self.n}, {g}')}, {idx}")
            self._store(ms, fn.gep("%w", slot, "float"), mask)
            self._store(vs, fn.gep(self.w_vs, slot, "float"), mask)
            # keys not seen leave S alone as fma(S, 1, 0) = S: S is never -0 (it starts at +0 and
            # adds values >= +0), the one S whose sum with +0 is another float
            ms = fn.v(f"select <{lanes} x i1> {seen}, {vf} {ms}, {vf} splat (float 1.0)")
            vs = fn.v(f"select <{lanes} x i1> {seen}, {vf} {vs}, {vf} zeroinitializer")
            for k in range(lanes):
                ms_k = fn.v(f"extractelement {vf} {ms}, i64 {k}")
                vs_k = fn.v(f"extractelement {vf} {vs}, i64 {k}")
                total = fn.v(f"call float @llvm.fma.f32(float {total}, float {ms_k}, float {vs_k})")
            out += [m, total]
        return out


def render_softmax(head_dim: int, heads: int, softcap: bool, vector_expf: bool | None = None, *,
                   accumulator: str = "f16") -> tuple[str, str]:
    """LLVM IR for the online softmax of `heads` query heads of one row (sharing one KV head) over
    keys [first, end):

        kin_attn_softmax_hd{D}_g{G}_b{L}[_cap][_libm][_acc32](scores, vis, v, out, w, stride, first, end,
                                                              scale_bits, cap_bits, sstride)

    scores f32 [G, sstride] and vis u8 indexed j - first (vis 0: the row does not see key j), v the
    f16 cache of values at the KV head's first element (key j at v + j * stride), out f32 [G, D],
    w scratch f32 [2, G, end - first]; scale and cap are f32 bit patterns. In
    `numerics.attention_online`'s order, per head and visible key: s = score * scale (then
    cap * tanhf(s)); on a new maximum ms = expf(m - s), vs = 1, else ms = 1, vs = expf(s - m) (the C
    library's expf); S = fma(S, ms, vs); acc = f16(acc * ms) (exact in f32: an f16 value times an
    f32) where ms is not 1, then acc = f16(fma(v, vs, acc)). out = acc * (1/S), 0 where S is 0.
    accumulator "f32" ("key_chain_f16_acc32", suffix _acc32) drops the two roundings to f16: acc * ms
    and the fma stay f32; every other step is the same.

    Two passes: the first runs each head's scalar chains (max, S) over blocks of L keys (L = 16 on
    AVX-512, 8 on AVX2; a masked last block): the block's running maxima first, then its L expf
    arguments as one vector, one expf of them (`expf_ir.emit_expf`, glibc's expf bit for bit; the
    C library's expf lane by lane where `expf_ir.use_vector_expf()` says no, or vector_expf is
    False), then S over the block; it stores ms and vs. The second updates the accumulators, in
    registers, with no calls in between, for as many heads at a time as fit (256 floats), each
    value row widened once for them."""
    if head_dim % 64 or head_dim <= 0:
        raise ValueError(f"the softmax kernel needs a head dim that is a multiple of 64, not {head_dim}")
    if accumulator not in ACCUMULATORS:
        raise ValueError(f"the softmax kernel's accumulator is one of {ACCUMULATORS}, not {accumulator!r}")
    if vector_expf is None:
        vector_expf = expf_ir.use_vector_expf()
    lanes = expf_ir.expf_lanes()
    name = f"kin_attn_softmax_hd{head_dim}_g{heads}_b{lanes}"  # b: keys a block of the first pass
    name += ("_cap" if softcap else "") + ("" if vector_expf else "_libm") + ("_acc32" if accumulator == "f32" else "")
    fn = Function(name, SOFTMAX_PARAMS)
    chunks = head_dim // 64
    n = fn.v("sub i64 %end, %first")
    pass_a = _PassA(fn, heads, softcap, lanes, vector_expf, n)
    sums, w_vs = pass_a.run(), pass_a.w_vs

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
        scaled = _rescale(fn, accs, scales, chunks, accumulator)
        new = [""] * (len(members) * chunks)
        for c in range(chunks):
            h = fn.load("<64 x half>", fn.gep(row, 64 * c, "i16"), 2)
            vf = fn.v(f"fpext <64 x half> {h} to <64 x float>")
            for k, (_ms, vs_v, _flag) in enumerate(scales):
                summed = fn.v(f"call <64 x float> @llvm.fma.v64f32(<64 x float> {vf}, <64 x float> {vs_v}, "
                              f"<64 x float> {scaled[k * chunks + c]})")
                new[k * chunks + c] = _stored(fn, summed, accumulator)
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
    declarations += expf_ir.masked_declarations(lanes, ("float", "i8"))
    if vector_expf:
        declarations += expf_ir.declarations(lanes)
    return module([fn], declarations), fn.name
