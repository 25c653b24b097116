"""Renders the prompt attention tile: up to 16 (row, query head) chains of one sequence and one KV
head advanced together over the keys, each key and value row read and widened once for all of them.

Owns: `render_tile(head_dim, softcap)`, LLVM IR for

    kin_attn_tile_hd{D}[_cap][_libm](q, k, v, out, lo, hi, vis, stride, first, end, scale_bits, cap_bits)

A chain is one vector lane: lane c's query q[c] (f32 [16, D], values already rounded to f16) and
its output out[c] (f32 [16, D]). Lane c sees key j in [first, end) when lo[c] <= j < hi[c] (i32
[16]) and, where vis is not null, vis[(j - first) * 16 + c] != 0 (u8: rows whose keys are not one
run, such as a draft tree's). k and v are the f16 cache at the KV head's first element (key j at
+ j * stride elements); scale and cap are f32 bit patterns. Which rows and heads share a tile is the
caller's (step_attention.py): the kernel treats every lane alike.

Per key j, every lane follows `numerics.attention_online` with the same operations, in the same
order, as the one-row kernels of attention_ir.py:

* its score `dot_f16(q[c], key j)`: 64 lanes of f32 sums over the chunks of 64 (q*k of two f16
  values is exact in f32, so each step is one fma, the first onto +0 as the reference's zero
  accumulator), folded (l[t] + l[32+t]) + (l[16+t] + l[48+t]), then halves 16 -> 8 -> 4 and
  (l0 + l2) + (l1 + l3). The last folds of 16 chains run together as a transpose (`_transpose_fold`):
  each add of a step holds the same pair of partial sums of one chain as the one-chain fold, so
  lane c ends with chain c's score;
* its softmax step as one vector over the lanes: s = score * scale (then cap * tanhf(s)); on a new
  maximum (s > m, key seen) ms = expf(m - s), vs = 1, m = s, else ms = 1, vs = expf(s - m) (the C
  library's expf: `expf_ir.emit_expf` where its guard allows, else calls); S = fma(S, ms, vs) where
  the key is seen;
* its accumulator (f32 values of f16 numbers on the stack), for the lanes that see the key:
  acc = f16(acc * ms) where ms is not 1, then acc = f16(fma(v, vs, acc)), the value row widened once
  for all lanes. Finally out = acc * (1/S), 0 where S is 0.

No value crosses lanes except a chain's own partial sums, so a chain's bits do not depend on which
lanes its neighbours hold or on how many lanes are live: a row gets the same floats in any tile.
Head dims that are not a multiple of 64 are not rendered (attention_ir.py's note).

Why LLVM IR: the per-key work is a few hundred vector instructions with no calls; as numba it
would keep the folds and the accumulators in memory scalar by scalar.
"""

from __future__ import annotations

from kinetic.codegen.cpu import expf_ir
from kinetic.codegen.cpu.llvm_ir import Function, const_vec, module

LANES = 16  # chains a tile: one lane of a 512-bit vector each
PARAMS = [("ptr", "q"), ("ptr", "k"), ("ptr", "v"), ("ptr", "out"), ("ptr", "lo"), ("ptr", "hi"), ("ptr", "vis"),
          ("i64", "stride"), ("i64", "first"), ("i64", "end"), ("i64", "scale_bits"), ("i64", "cap_bits")]
VF = f"<{LANES} x float>"
VH = f"<{LANES} x half>"
VB = f"<{LANES} x i1>"


def _add(fn: Function, a: str, b: str) -> str:
    return fn.v(f"fadd {VF} {a}, {b}")


def _pairs(fn: Function, xs: list[str], high: list[int], low: list[int]) -> list[str]:
    """For each pair of vectors (x, y): shuffle(x, y, high) + shuffle(x, y, low)."""
    out = []
    for x, y in zip(xs[0::2], xs[1::2], strict=True):
        hi = fn.v(f"shufflevector {VF} {x}, {VF} {y}, {const_vec('i32', high)}")
        lo = fn.v(f"shufflevector {VF} {x}, {VF} {y}, {const_vec('i32', low)}")
        out.append(_add(fn, hi, lo))
    return out


def _transpose_fold(fn: Function, v16: list[str]) -> str:
    """16 chains' 16-lane partial sums -> one vector whose lane c is chain c's score: the halves
    16 -> 8 -> 4 (high half + low half), then (l0 + l2) + (l1 + l3), each step adding the pairs
    of two chains' (then four, eight) vectors at once. After the first step lanes 8c'..8c'+7 of a
    vector hold one chain's 8 sums, after the second lanes 4c'.. its 4, after the third lanes 2c'..
    its (l0 + l2, l1 + l3), in chain order throughout."""
    def blocks(size: int, take: int, offset: int) -> list[int]:
        """Of two vectors side by side (32 lanes) in blocks of `size`: lanes offset .. offset + take - 1
        of each block."""
        return [b * size + offset + t for b in range(2 * LANES // size) for t in range(take)]

    v8 = _pairs(fn, v16, blocks(16, 8, 8), blocks(16, 8, 0))
    v4 = _pairs(fn, v8, blocks(8, 4, 4), blocks(8, 4, 0))
    v2 = _pairs(fn, v4, blocks(4, 2, 0), blocks(4, 2, 2))
    return _pairs(fn, v2, blocks(2, 1, 0), blocks(2, 1, 1))[0]


class _Tile:
    """The kernel being written: its loop body is one key for all lanes."""

    def __init__(self, head_dim: int, softcap: bool, vector_expf: bool):
        self.hd, self.softcap, self.vector_expf = head_dim, softcap, vector_expf
        self.parts = head_dim // LANES  # 16-value parts of a head
        name = f"kin_attn_tile_hd{head_dim}" + ("_cap" if softcap else "") + ("" if vector_expf else "_libm")
        self.fn = fn = Function(name, PARAMS)
        scale = fn.v(f"bitcast i32 {fn.v('trunc i64 %scale_bits to i32')} to float")
        self.scale = fn.splat_value(LANES, "float", scale)
        self.cap = fn.v(f"bitcast i32 {fn.v('trunc i64 %cap_bits to i32')} to float")
        self.lo = fn.load(f"<{LANES} x i32>", "%lo", 4)
        self.hi = fn.load(f"<{LANES} x i32>", "%hi", 4)
        self.has_vis = fn.v("icmp ne ptr %vis, null")
        self.acc = fn.v(f"alloca [{LANES * head_dim} x float], align 64")

    def _at(self, base: str, lane: int, part: int, elem: str) -> str:
        return self.fn.gep(base, lane * self.hd + part * LANES, elem)

    def _row(self, base: str, j: str) -> list[str]:
        """Key or value row j widened to f32, in 16-value parts."""
        fn = self.fn
        row = fn.gep(base, fn.v(f"mul i64 {j}, %stride"), "i16")
        return [fn.v(f"fpext {VH} {fn.load(VH, fn.gep(row, LANES * p, 'i16'), 2)} to {VF}") for p in range(self.parts)]

    def scores(self, j: str) -> str:
        """dot_f16 of every lane's query with key j, lane c holding chain c's."""
        fn, keys = self.fn, self._row("%k", j)
        v16 = []
        for lane in range(LANES):
            quarters = ["zeroinitializer"] * 4  # lanes 16t .. 16t + 15 of dot_f16's 64
            for p in range(self.parts):
                q = fn.load(VF, self._at("%q", lane, p, "float"), 4)
                quarters[p % 4] = fn.v(f"call {VF} @llvm.fma.v16f32({VF} {q}, {VF} {keys[p]}, {VF} {quarters[p % 4]})")
            v16.append(_add(fn, _add(fn, quarters[0], quarters[2]), _add(fn, quarters[1], quarters[3])))
        return _transpose_fold(fn, v16)

    def seen(self, j: str) -> str:
        """<16 x i1>: the lanes that see key j."""
        fn = self.fn
        jv = fn.splat_value(LANES, "i32", fn.v(f"trunc i64 {j} to i32"))
        inside = fn.v(f"and {VB} {fn.v(f'icmp sge <{LANES} x i32> {jv}, {self.lo}')}, "
                      f"{fn.v(f'icmp slt <{LANES} x i32> {jv}, {self.hi}')}")
        pre, table, join = fn.block, fn.fresh("table"), fn.fresh("seen")
        fn.do(f"br i1 {self.has_vis}, label %{table}, label %{join}")
        fn.label(table)
        at = fn.gep("%vis", fn.v(f"mul i64 {fn.v(f'sub i64 {j}, %first')}, {LANES}"))
        marked = fn.v(f"icmp ne <{LANES} x i8> {fn.load(f'<{LANES} x i8>', at, 1)}, zeroinitializer")
        both = fn.v(f"and {VB} {inside}, {marked}")
        fn.do(f"br label %{join}")
        fn.label(join)
        return fn.v(f"phi {VB} [{inside}, %{pre}], [{both}, %{table}]")

    def _lanes_map(self, v: str, call) -> str:
        fn, out = self.fn, "poison"
        for k in range(LANES):
            x = fn.v(f"extractelement {VF} {v}, i64 {k}")
            out = fn.v(f"insertelement {VF} {out}, float {call(x)}, i64 {k}")
        return out

    def softmax(self, score: str, seen: str, m: str, total: str) -> tuple[str, str, str, str, str]:
        """One key's online-softmax step on every lane: (ms, vs, rescale lanes, m, S) after it."""
        fn = self.fn
        s = fn.v(f"fmul {VF} {score}, {self.scale}")
        if self.softcap:
            s = self._lanes_map(s, lambda x: fn.v(f"fmul float {self.cap}, {fn.v(f'call float @tanhf(float {x})')}"))
        new_max = fn.v(f"and {VB} {fn.v(f'fcmp ogt {VF} {s}, {m}')}, {seen}")
        arg = fn.v(f"select {VB} {new_max}, {VF} {fn.v(f'fsub {VF} {m}, {s}')}, {VF} {fn.v(f'fsub {VF} {s}, {m}')}")
        if self.vector_expf:
            e = expf_ir.emit_expf(fn, arg, LANES)
        else:
            e = self._lanes_map(arg, lambda x: fn.v(f"call float @expf(float {x})"))
        ms = fn.v(f"select {VB} {new_max}, {VF} {e}, {VF} splat (float 1.0)")
        vs = fn.v(f"select {VB} {new_max}, {VF} splat (float 1.0), {VF} {e}")
        fma = fn.v(f"call {VF} @llvm.fma.v16f32({VF} {total}, {VF} {ms}, {VF} {vs})")
        rescale = fn.v(f"and {VB} {new_max}, {fn.v(f'fcmp une {VF} {ms}, splat (float 1.0)')}")
        return (ms, vs, rescale, fn.v(f"select {VB} {new_max}, {VF} {s}, {VF} {m}"),
                fn.v(f"select {VB} {seen}, {VF} {fma}, {VF} {total}"))

    def _per_lane(self, mask: str, update) -> None:
        """update(lane) for each lane set in mask, behind a branch each."""
        fn = self.fn
        for lane in range(LANES):
            work, skip = fn.fresh("lane"), fn.fresh("next")
            fn.do(f"br i1 {fn.v(f'extractelement {VB} {mask}, i64 {lane}')}, label %{work}, label %{skip}")
            fn.label(work)
            update(lane)
            fn.do(f"br label %{skip}")
            fn.label(skip)

    def _acc(self, lane: int, part: int) -> tuple[str, str]:
        at = self._at(self.acc, lane, part, "float")
        return at, self.fn.load(VF, at, 4)

    def _put(self, at: str, value: str) -> None:
        h = self.fn.v(f"fptrunc {VF} {value} to {VH}")
        self.fn.store(VF, self.fn.v(f"fpext {VH} {h} to {VF}"), at, 4)

    def accumulate(self, j: str, seen: str, ms: str, vs: str, rescale: str) -> None:
        """The lanes that see key j: acc = f16(acc * ms) on a new maximum (rare after the first
        keys: one branch skips it for all lanes), then acc = f16(fma(v, vs, acc))."""
        fn = self.fn
        any_new = fn.v(f"icmp ne i{LANES} {fn.v(f'bitcast {VB} {rescale} to i{LANES}')}, 0")
        work, join = fn.fresh("rescale"), fn.fresh("rescaled")
        fn.do(f"br i1 {any_new}, label %{work}, label %{join}")
        fn.label(work)

        def scale(lane: int) -> None:
            factor = fn.splat_value(LANES, "float", fn.v(f"extractelement {VF} {ms}, i64 {lane}"))
            for p in range(self.parts):
                at, acc = self._acc(lane, p)
                self._put(at, fn.v(f"fmul {VF} {acc}, {factor}"))

        self._per_lane(rescale, scale)
        fn.do(f"br label %{join}")
        fn.label(join)
        values = self._row("%v", j)

        def add(lane: int) -> None:
            weight = fn.splat_value(LANES, "float", fn.v(f"extractelement {VF} {vs}, i64 {lane}"))
            for p in range(self.parts):
                at, acc = self._acc(lane, p)
                self._put(at, fn.v(f"call {VF} @llvm.fma.v16f32({VF} {values[p]}, {VF} {weight}, {VF} {acc})"))

        self._per_lane(seen, add)

    def render(self) -> tuple[str, str]:
        fn = self.fn
        for lane in range(LANES):
            for p in range(self.parts):
                fn.store(VF, "zeroinitializer", self._at(self.acc, lane, p, "float"), 4)

        def key(j: str, carried: list[str]) -> list[str]:
            seen = self.seen(j)
            ms, vs, rescale, m, total = self.softmax(self.scores(j), seen, *carried)
            self.accumulate(j, seen, ms, vs, rescale)
            return [m, total]

        start = [(VF, "splat (float 0xFFF0000000000000)"), (VF, "zeroinitializer")]
        total = fn.loop("%first", "%end", start, key)[1]
        is_zero = fn.v(f"fcmp oeq {VF} {total}, zeroinitializer")
        inv = fn.v(f"select {VB} {is_zero}, {VF} zeroinitializer, {VF} {fn.v(f'fdiv {VF} splat (float 1.0), {total}')}")
        for lane in range(LANES):
            factor = fn.splat_value(LANES, "float", fn.v(f"extractelement {VF} {inv}, i64 {lane}"))
            for p in range(self.parts):
                value = fn.v(f"fmul {VF} {self._acc(lane, p)[1]}, {factor}")
                fn.store(VF, value, self._at("%out", lane, p, "float"), 4)
        fn.do("ret void")
        declarations = ["declare float @expf(float)", "declare float @tanhf(float)",
                        f"declare {VF} @llvm.fma.v16f32({VF}, {VF}, {VF})"]
        if self.vector_expf:
            declarations += expf_ir.declarations(LANES)
        return module([fn], declarations), fn.name


def render_tile(head_dim: int, softcap: bool, vector_expf: bool | None = None) -> tuple[str, str]:
    """The tile kernel for heads `head_dim` wide (a multiple of 64) with or without a softcap;
    vector_expf as render_softmax's (None: the guard's choice)."""
    if head_dim % 64 or head_dim <= 0:
        raise ValueError(f"the attention tile needs a head dim that is a multiple of 64, not {head_dim}")
    if vector_expf is None:
        vector_expf = expf_ir.use_vector_expf()
    return _Tile(head_dim, softcap, vector_expf).render()
