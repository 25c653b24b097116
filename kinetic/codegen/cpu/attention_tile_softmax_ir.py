"""The prompt attention tile's first phase (attention_tile_ir.py's kernel runs it once a block of
keys): every lane's score and online-softmax step for each key of the block, stored for the second
phase (the accumulators).

Owns: `KeySteps`, which writes into the tile kernel being rendered

* `block(j0, j1, (m, S))`: for the keys [j0, j1) (at most KEY_BLOCK), first every key's scores for
  all 16 lanes and its value row widened to f32 into the `Scratch`, then every key's softmax step
  from them, in key order, storing its ms and vs vectors and its `seen` and `rescale` lane masks;
  returns (m, S) after the block;
* `Scratch`: where those lie, and how the second phase reads them back (`weight`, `masks`,
  `value_at`), in the kernel or in a helper function given the same pointers.

Per key j, lane c follows `numerics.attention_online`:

* its score `dot_f16(q[c], key j)`: 64 lanes of f32 sums over the chunks of 64 (q*k of two f16
  values is exact in f32, so each step is one fma, the first onto +0 as the reference's zero
  accumulator), folded (l[t] + l[32+t]) + (l[16+t] + l[48+t]), then halves 16 -> 8 -> 4 and
  (l0 + l2) + (l1 + l3). The last folds of 16 chains run together as a transpose (`_transpose_fold`):
  each add of a step holds the same pair of partial sums of one chain as the one-chain fold, so
  lane c ends with chain c's score. With one chunk (D 64) each l[t] is one exact product, so
  l[t] + l[32+t] is fma(q[32+t], k[32+t], l[t]): the same rounding of the same exact sum (and the
  same +0 where both are zeros, l[t] being +0 rather than -0 as the fma onto +0 leaves it), two
  operations fewer per chain and key (benchmarks/attention_orders_ab.py's prompt at SmolLM2's shape:
  about 3-4 % less attention time);
* its softmax step as one vector over the lanes: s = score * scale (then cap * tanhf(s)); on a new
  maximum (s > m, key seen) ms = expf(m - s), vs = 1, m = s, else ms = 1, vs = expf(s - m) (the C
  library's expf: `expf_ir.emit_expf` where its guard allows, else calls); S = fma(S, ms, vs) where
  the key is seen; `rescale` marks the lanes with a new maximum whose ms is not 1.

Why scores first: a key's score ends a long chain (fmas, four fold levels, the scale) that its
softmax step and expf continue; as one loop body the chains of consecutive keys barely overlap.
A loop of scores alone has no carried value, and the softmax loop's only carried chain is m's
compare and select (and S's fma), so each loop runs at its operations' throughput. The block's
scratch takes 6 KiB of the stack plus its value rows (8 KiB at D 64, 32 KiB at D 256).

Tried and measured slower (benchmarks/attention_orders_ab.py's prompts, same bits): two keys a
scores iteration sharing each q load (+0-15 %: the registers run out at D 256), and the chains'
scores with q transposed once a tile so that the fold needs no shuffles (+7-15 %: 64 broadcasts of
key values a key cost more than the 30 shuffles they save).
"""

from __future__ import annotations

from dataclasses import dataclass

from kinetic.codegen.cpu import expf_ir
from kinetic.codegen.cpu.llvm_ir import Function, const_vec

LANES = 16  # chains a tile: one lane of a 512-bit vector each
VF = f"<{LANES} x float>"
VH = f"<{LANES} x half>"
VB = f"<{LANES} x i1>"
MASK = f"i{LANES}"  # a lane mask as an integer, bit c for lane c
KEY_BLOCK = 32  # keys whose steps are stored before their accumulator steps


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


@dataclass
class Scratch:
    """Where phase one leaves a block for phase two, in the function `fn` being written (`ptrs`: its
    allocas, or a helper's parameters of the same names): f32 [KEY_BLOCK, 16] scores, ms and vs,
    f32 [KEY_BLOCK, D] value rows widened, and [KEY_BLOCK] seen and rescale lane masks."""

    fn: Function
    hd: int
    ptrs: dict[str, str]

    KINDS = ("score", "ms", "vs", "values", "seen", "rescale")

    @classmethod
    def allocate(cls, fn: Function, head_dim: int) -> Scratch:
        sizes = {"values": f"[{KEY_BLOCK * head_dim} x float]", "seen": f"[{KEY_BLOCK} x {MASK}]",
                 "rescale": f"[{KEY_BLOCK} x {MASK}]"}
        return cls(fn, head_dim, {kind: fn.v(f"alloca {sizes.get(kind, f'[{KEY_BLOCK * LANES} x float]')}, align 64")
                                  for kind in cls.KINDS})

    def slot(self, kind: str, idx: str) -> str:
        """Where key idx of the block keeps its score, ms or vs vector (`kind`)."""
        return self.fn.gep(self.ptrs[kind], self.fn.v(f"mul i64 {idx}, {LANES}"), "float")

    def value_at(self, idx: str, part: int) -> str:
        """Where part `part` of key idx's widened value row lies."""
        at = self.fn.v(f"add i64 {self.fn.v(f'mul i64 {idx}, {self.hd}')}, {part * LANES}")
        return self.fn.gep(self.ptrs["values"], at, "float")

    def mask_at(self, kind: str, idx: str) -> str:
        return self.fn.gep(self.ptrs[kind], idx, MASK)

    def masks(self, idx: str) -> tuple[str, str]:
        """Key idx's (seen, rescale) lane masks, as integers."""
        return tuple(self.fn.load(MASK, self.mask_at(kind, idx), 2) for kind in ("seen", "rescale"))

    def weight(self, kind: str, idx: str, lane: int) -> str:
        """The lane's ms or vs (`kind`) at key idx, as a vector of 16 copies."""
        fn = self.fn
        at = fn.v(f"add i64 {fn.v(f'mul i64 {idx}, {LANES}')}, {lane}")
        return fn.splat_value(LANES, "float", fn.load("float", fn.gep(self.ptrs[kind], at, "float"), 4))


class KeySteps:
    """Phase one of the tile kernel `fn` (parameters q, k, lo, hi, vis, stride, first, scale_bits,
    cap_bits as attention_tile_ir's PARAMS) for heads `head_dim` wide."""

    def __init__(self, fn: Function, head_dim: int, softcap: bool, vector_expf: bool):
        self.fn, self.hd, self.softcap, self.vector_expf = fn, head_dim, softcap, vector_expf
        self.parts = head_dim // LANES  # 16-value parts of a head
        scale = fn.v(f"bitcast i32 {fn.v('trunc i64 %scale_bits to i32')} to float")
        self.scale = fn.splat_value(LANES, "float", scale)
        self.cap = fn.v(f"bitcast i32 {fn.v('trunc i64 %cap_bits to i32')} to float")
        self.lo = fn.load(f"<{LANES} x i32>", "%lo", 4)
        self.hi = fn.load(f"<{LANES} x i32>", "%hi", 4)
        self.has_vis = fn.v("icmp ne ptr %vis, null")
        self.scratch = Scratch.allocate(fn, head_dim)

    def row(self, base: str, j: str, parts: range | None = None) -> list[str]:
        """Key or value row j widened to f32, in 16-value parts (all, or `parts`)."""
        fn = self.fn
        row = fn.gep(base, fn.v(f"mul i64 {j}, %stride"), "i16")
        return [fn.v(f"fpext {VH} {fn.load(VH, fn.gep(row, LANES * p, 'i16'), 2)} to {VF}")
                for p in (range(self.parts) if parts is None else parts)]

    def block(self, j0: str, j1: str, carried: list[str]) -> list[str]:
        """Keys [j0, j1): their scores, then their softmax steps; (m, S) after them."""
        fn = self.fn
        fn.loop(j0, j1, [], lambda j, _c: self._store_scores(j, j0))
        return fn.loop(j0, j1, [(VF, c) for c in carried], lambda j, c: self._step(j, j0, c))

    def _store_scores(self, j: str, j0: str) -> list[str]:
        """Key j's scores, and its value row widened, to the scratch."""
        fn = self.fn
        idx = fn.v(f"sub i64 {j}, {j0}")
        fn.store(VF, self._scores(j), self.scratch.slot("score", idx), 64)
        for p, value in enumerate(self.row("%v", j)):
            fn.store(VF, value, self.scratch.value_at(idx, p), 64)
        return []

    def _scores(self, j: str) -> str:
        """dot_f16 of every lane's query with key j, lane c holding chain c's."""
        fn, keys = self.fn, self.row("%k", j)
        v16 = []
        for lane in range(LANES):
            def fma(p: int, acc: str, lane: int = lane) -> str:
                """fma(q[lane] part p, key part p, acc)."""
                q = fn.load(VF, fn.gep("%q", lane * self.hd + p * LANES, "float"), 4)
                return fn.v(f"call {VF} @llvm.fma.v16f32({VF} {q}, {VF} {keys[p]}, {VF} {acc})")

            if self.parts == 4:  # one chunk of 64: the first fold level as fmas (the module docstring)
                v16.append(_add(fn, fma(2, fma(0, "zeroinitializer")), fma(3, fma(1, "zeroinitializer"))))
                continue
            quarters = ["zeroinitializer"] * 4  # lanes 16t .. 16t + 15 of dot_f16's 64
            for p in range(self.parts):
                quarters[p % 4] = fma(p, quarters[p % 4])
            v16.append(_add(fn, _add(fn, quarters[0], quarters[2]), _add(fn, quarters[1], quarters[3])))
        return _transpose_fold(fn, v16)

    def _seen(self, j: str) -> str:
        """<16 x i1>: the lanes that see key j (inside [lo, hi), and marked in vis where it is given)."""
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

    def _step(self, j: str, j0: str, carried: list[str]) -> list[str]:
        """Key j's softmax step on every lane from its stored scores; ms, vs and the lane masks to
        the scratch; (m, S) after it."""
        fn = self.fn
        m, total = carried
        idx = fn.v(f"sub i64 {j}, {j0}")
        seen = self._seen(j)
        s = fn.v(f"fmul {VF} {fn.load(VF, self.scratch.slot('score', idx), 64)}, {self.scale}")
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
        summed = fn.v(f"call {VF} @llvm.fma.v16f32({VF} {total}, {VF} {ms}, {VF} {vs})")
        rescale = fn.v(f"and {VB} {new_max}, {fn.v(f'fcmp une {VF} {ms}, splat (float 1.0)')}")
        fn.store(VF, ms, self.scratch.slot("ms", idx), 64)
        fn.store(VF, vs, self.scratch.slot("vs", idx), 64)
        for kind, mask in (("seen", seen), ("rescale", rescale)):
            fn.store(MASK, fn.v(f"bitcast {VB} {mask} to {MASK}"), self.scratch.mask_at(kind, idx), 2)
        return [fn.v(f"select {VB} {new_max}, {VF} {s}, {VF} {m}"),
                fn.v(f"select {VB} {seen}, {VF} {summed}, {VF} {total}")]

    @staticmethod
    def declarations(vector_expf: bool) -> list[str]:
        out = ["declare float @expf(float)", "declare float @tanhf(float)",
               f"declare {VF} @llvm.fma.v16f32({VF}, {VF}, {VF})"]
        return out + (expf_ir.declarations(LANES) if vector_expf else [])
