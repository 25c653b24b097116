"""Renders the prompt attention tile: up to 16 (row, query head) chains of one sequence and one KV
head advanced together over the keys, each key and value row read and widened once for all of them,
in either order of an f16 cache.

Owns: `render_tile(head_dim, softcap, accumulator=...)`, LLVM IR for

    kin_attn_tile_hd{D}[_cap][_libm][_acc32](q, k, v, out, lo, hi, vis, stride, first, end, scale_bits, cap_bits)

A chain is one vector lane: lane c's query q[c] (f32 [16, D], values already rounded to f16) and
its output out[c] (f32 [16, D]). Lane c sees key j in [first, end) when lo[c] <= j < hi[c] (i32
[16]) and, where vis is not null, vis[(j - first) * 16 + c] != 0 (u8: rows whose keys are not one
run, such as a draft tree's). k and v are the f16 cache at the KV head's first element (key j at
+ j * stride elements); scale and cap are f32 bit patterns. Which rows and heads share a tile is the
caller's (step_attention.py): the kernel treats every lane alike.

The keys go in blocks of KEY_BLOCK, each in two phases:

1. every key of the block for all 16 lanes: its scores, then its online-softmax step
   (attention_tile_softmax_ir.py), storing each key's ms and vs, its seen and rescale lane masks
   and its value row widened to f32;
2. for each group of accumulators that fits in registers (GROUP_FLOATS floats: 4 lanes at D 64, a
   lane at D 256, half a lane at D 512), the keys of the block in order: where a lane rescales,
   acc = acc * ms; where it sees the key, acc = fma(v, vs, acc). In ggml's order
   ("key_chain_f16", accumulator "f16") each of the two is rounded to f16 (the accumulator's f32
   holds f16 values); in "key_chain_f16_acc32" ("f32", suffix _acc32) neither is. When every lane
   of the group sees the key it is plain fmas, else a select per lane keeps the others'. Lanes that
   see no key at all (lo >= hi: a partial tile's padding, a row with nothing in its window) count as
   seeing every key there: their accumulators take whatever comes and are never read.
   The accumulators are loaded from and stored to the tile's stack copy once a block.

Finally out = acc * (1/S), and 0 where S is 0 (exactly the lanes that saw no key: S is 1 or more,
or NaN, after a lane's first key). Each lane's accumulator takes `numerics.attention_online`'s
steps in key order; only which lane's step comes first changes, and no value crosses lanes except a
chain's own partial sums, so a row's bits do not depend on its tile, its neighbours or how many lanes
are live. Head dims that are not a multiple of 64 are not rendered (attention_ir.py's note).

Why blocks: one key at a time, every lane's accumulator is loaded and stored once a key (16 lanes x
D / 16 vectors), which bounds the kernel by stores; here a block's accumulator steps are register
operations, and a value row is widened once a tile, not once a group. Attention over a 512-row
prompt, one thread (benchmarks/attention_orders_ab.py): ggml's order 34 % less time than one key
at a time at SmolLM2-135M's shape, 18 % at Gemma 3 270M's. Why LLVM IR: the per-key work is a few
hundred vector instructions with no calls; as numba it would keep the folds and accumulators in
memory.
"""

from __future__ import annotations

from kinetic.codegen.cpu import expf_ir
from kinetic.codegen.cpu.attention_tile_softmax_ir import KEY_BLOCK, LANES, MASK, VB, VF, VH, KeySteps, Scratch
from kinetic.codegen.cpu.llvm_ir import Function, module

PARAMS = [("ptr", "q"), ("ptr", "k"), ("ptr", "v"), ("ptr", "out"), ("ptr", "lo"), ("ptr", "hi"), ("ptr", "vis"),
          ("i64", "stride"), ("i64", "first"), ("i64", "end"), ("i64", "scale_bits"), ("i64", "cap_bits")]
ACCUMULATORS = ("f16", "f32")  # "key_chain_f16" (ggml's) and "key_chain_f16_acc32"
GROUP_FLOATS = 256  # accumulator floats a group holds in registers (16 of 32 AVX-512 registers)
START = [(VF, "splat (float 0xFFF0000000000000)"), (VF, "zeroinitializer")]  # every lane's (m, S) before the keys


def _groups(head_dim: int, floats: int) -> list[tuple[range, range]]:
    """The accumulators in groups of (lanes, 16-value parts) of at most `floats` floats: whole
    lanes where a lane fits (4 lanes at D 64 and 256 floats), else a lane in runs of floats / 16
    parts."""
    parts = head_dim // LANES
    if head_dim <= floats:
        step = floats // head_dim
        return [(range(lane, min(LANES, lane + step)), range(parts)) for lane in range(0, LANES, step)]
    step = floats // LANES
    return [(range(lane, lane + 1), range(p, min(parts, p + step))) for lane in range(LANES)
            for p in range(0, parts, step)]


class _Group:
    """Phase 2 for one group of accumulators (parts `parts` of lanes `lanes`) as a helper function of
    the kernel, called once a block:

        {kernel}_g{n}(acc, <the Scratch's pointers>, j0, j1, live)

    Why a function of its own: in the kernel's one body LLVM hoists phase one's constants out of
    every loop, and the register allocator then spills the group's accumulators in its key loop."""

    def __init__(self, kernel: str, number: int, hd: int, lanes: range, parts: range, accumulator: str):
        self.hd, self.lanes, self.parts, self.accumulator = hd, lanes, parts, accumulator
        params = [("ptr", "acc")] + [("ptr", kind) for kind in Scratch.KINDS] + [("i64", "j0"), ("i64", "j1"),
                                                                                 ("i64", "live")]
        self.fn = Function(f"{kernel}_g{number}", params, linkage="internal", attributes="noinline")
        self.scratch = Scratch(self.fn, hd, {kind: f"%{kind}" for kind in Scratch.KINDS})
        self._body()

    def call(self, fn: Function, acc: str, scratch: Scratch, j0: str, j1: str, live: str) -> None:
        args = [f"ptr {acc}"] + [f"ptr {scratch.ptrs[kind]}" for kind in Scratch.KINDS]
        fn.do(f"call void @{self.fn.name}({', '.join(args + [f'i64 {j0}', f'i64 {j1}', f'i64 {live}'])})")

    def _at(self, lane: int, part: int) -> str:
        return self.fn.gep("%acc", lane * self.hd + part * LANES, "float")

    def _body(self) -> None:
        fn, lanes, parts = self.fn, self.lanes, self.parts
        start = [(VF, fn.load(VF, self._at(lane, p), 4)) for lane in lanes for p in parts]
        bits = sum(1 << lane for lane in lanes)
        needed = fn.v(f"and {MASK} {fn.v(f'trunc i64 %live to {MASK}')}, {bits}")  # the lanes whose accumulators matter

        def key(j: str, accs: list[str]) -> list[str]:
            idx = fn.v(f"sub i64 {j}, %j0")
            seen, rescale = self.scratch.masks(idx)
            accs = self._branch(fn.v(f"icmp ne {MASK} {fn.v(f'and {MASK} {rescale}, {bits}')}, 0"), accs,
                                lambda: self._rescale(idx, rescale, accs), lambda: accs)
            # the common key: every needed lane of the group sees it (plain fmas); else a select per
            # lane keeps the accumulators of the lanes that do not
            return self._branch(fn.v(f"icmp eq {MASK} {fn.v(f'and {MASK} {seen}, {needed}')}, {needed}"), accs,
                                lambda: self._add(idx, accs, None), lambda: self._add(idx, accs, seen))

        finals = fn.loop("%j0", "%j1", start, key)
        for value, (lane, p) in zip(finals, ((lane, p) for lane in lanes for p in parts), strict=True):
            fn.store(VF, value, self._at(lane, p), 4)
        fn.do("ret void")

    def _branch(self, flag: str, accs: list[str], if_true, if_false) -> list[str]:
        """The accumulators after if_true() or if_false() (each returns new ones), chosen by flag."""
        fn = self.fn
        yes, no, join = fn.fresh("yes"), fn.fresh("no"), fn.fresh("join")
        fn.do(f"br i1 {flag}, label %{yes}, label %{no}")
        ends = []
        for name, update in ((yes, if_true), (no, if_false)):
            fn.label(name)
            new = update()
            ends.append((new, fn.block))
            fn.do(f"br label %{join}")
        fn.label(join)
        (a, end_a), (b, end_b) = ends
        return [fn.v(f"phi {VF} [{x}, %{end_a}], [{y}, %{end_b}]") for x, y in zip(a, b, strict=True)]

    def _lane_flag(self, mask: str, lane: int) -> str:
        return self.fn.v(f"icmp ne {MASK} {self.fn.v(f'and {MASK} {mask}, {1 << lane}')}, 0")

    def _stored(self, value: str) -> str:
        """An accumulator step's result as the accumulator keeps it: rounded to f16, or the f32 as is."""
        if self.accumulator == "f32":
            return value
        return self.fn.v(f"fpext {VH} {self.fn.v(f'fptrunc {VF} {value} to {VH}')} to {VF}")

    def _per_lane(self, accs: list[str]):
        """(k, lane, that lane's accumulators in `accs`) for each lane of the group."""
        n = len(self.parts)
        return [(k, lane, accs[k * n: (k + 1) * n]) for k, lane in enumerate(self.lanes)]

    def _rescale(self, idx: str, rescale: str, accs: list[str]) -> list[str]:
        """acc = acc * ms (rounded as the order keeps it) for the lanes that rescale at this key."""
        fn, out = self.fn, []
        for _k, lane, mine in self._per_lane(accs):
            flag, factor = self._lane_flag(rescale, lane), self.scratch.weight("ms", idx, lane)
            for acc in mine:
                scaled = self._stored(fn.v(f"fmul {VF} {acc}, {factor}"))
                out.append(fn.v(f"select i1 {flag}, {VF} {scaled}, {VF} {acc}"))
        return out

    def _add(self, idx: str, accs: list[str], seen: str | None) -> list[str]:
        """acc = fma(v, vs, acc) (rounded as the order keeps it) for the lanes of the group that see
        key idx of the block (seen None: all of them), v from the block's widened value rows. (The
        lane flags come first: two branches that began with the same loads would have them hoisted
        above the branch, where they hold registers the accumulators need.)"""
        fn, out = self.fn, []
        flags = [None if seen is None else self._lane_flag(seen, lane) for lane in self.lanes]
        for k, lane, mine in self._per_lane(accs):
            weight = self.scratch.weight("vs", idx, lane)
            for p, acc in zip(self.parts, mine, strict=True):
                value = fn.load(VF, self.scratch.value_at(idx, p), 64)
                summed = self._stored(fn.v(f"call {VF} @llvm.fma.v16f32({VF} {value}, {VF} {weight}, {VF} {acc})"))
                out.append(summed if flags[k] is None else fn.v(f"select i1 {flags[k]}, {VF} {summed}, {VF} {acc}"))
        return out


class Tile:
    """The kernel being written (the module docstring)."""

    def __init__(self, head_dim: int, softcap: bool, vector_expf: bool, accumulator: str):
        self.hd, self.accumulator, self.vector_expf = head_dim, accumulator, vector_expf
        self.parts = head_dim // LANES  # 16-value parts of a head
        name = f"kin_attn_tile_hd{head_dim}" + ("_cap" if softcap else "") + ("" if vector_expf else "_libm")
        self.fn = fn = Function(name + ("_acc32" if accumulator == "f32" else ""), PARAMS)
        self.steps = KeySteps(fn, head_dim, softcap, vector_expf)
        self.acc = fn.v(f"alloca [{LANES * head_dim} x float], align 64")
        idle = fn.v(f"icmp sge <{LANES} x i32> {self.steps.lo}, {self.steps.hi}")
        live = fn.v(f"xor {MASK} {fn.v(f'bitcast {VB} {idle} to {MASK}')}, -1")  # lanes that see some key
        self.live = fn.v(f"zext {MASK} {live} to i64")
        self.groups: list[_Group] = []

    def _at(self, base: str, lane: int, part: int) -> str:
        return self.fn.gep(base, lane * self.hd + part * LANES, "float")

    def _block(self, j0: str, carried: list[str]) -> list[str]:
        fn = self.fn
        past = fn.v(f"add i64 {j0}, {KEY_BLOCK}")
        j1 = fn.v(f"select i1 {fn.v(f'icmp slt i64 {past}, %end')}, i64 {past}, i64 %end")
        carried = self.steps.block(j0, j1, carried)
        for group in self.groups:
            group.call(fn, self.acc, self.steps.scratch, j0, j1, self.live)
        return carried

    def render(self) -> tuple[str, str]:
        fn = self.fn
        self.groups = [_Group(fn.name, n, self.hd, lanes, parts, self.accumulator)
                       for n, (lanes, parts) in enumerate(_groups(self.hd, GROUP_FLOATS))]
        for lane in range(LANES):
            for p in range(self.parts):
                fn.store(VF, "zeroinitializer", self._at(self.acc, lane, p), 4)
        total = fn.loop("%first", "%end", START, self._block, step=KEY_BLOCK)[1]
        is_zero = fn.v(f"fcmp oeq {VF} {total}, zeroinitializer")
        inv = fn.v(f"fdiv {VF} splat (float 1.0), {total}")
        for lane in range(LANES):
            factor = fn.splat_value(LANES, "float", fn.v(f"extractelement {VF} {inv}, i64 {lane}"))
            saw_none = fn.v(f"extractelement {VB} {is_zero}, i64 {lane}")
            for p in range(self.parts):
                value = fn.v(f"fmul {VF} {fn.load(VF, self._at(self.acc, lane, p), 4)}, {factor}")
                value = fn.v(f"select i1 {saw_none}, {VF} zeroinitializer, {VF} {value}")
                fn.store(VF, value, self._at("%out", lane, p), 4)
        fn.do("ret void")
        return module([fn] + [g.fn for g in self.groups], KeySteps.declarations(self.vector_expf)), fn.name


def render_tile(head_dim: int, softcap: bool, vector_expf: bool | None = None, *,
                accumulator: str = "f16") -> tuple[str, str]:
    """The tile kernel for heads `head_dim` wide (a multiple of 64) with or without a softcap, with
    the value accumulator of the attention's order ("f16": ggml's "key_chain_f16", "f32":
    "key_chain_f16_acc32"); vector_expf as attention_ir.render_softmax's (None: the guard's choice)."""
    if head_dim % 64 or head_dim <= 0:
        raise ValueError(f"the attention tile needs a head dim that is a multiple of 64, not {head_dim}")
    if accumulator not in ACCUMULATORS:
        raise ValueError(f"the attention tile's accumulator is one of {ACCUMULATORS}, not {accumulator!r}")
    if vector_expf is None:
        vector_expf = expf_ir.use_vector_expf()
    return Tile(head_dim, softcap, vector_expf, accumulator).render()
