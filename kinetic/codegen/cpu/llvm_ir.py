"""A tiny builder for LLVM IR text: fresh SSA names, blocks, counted loops with carried values.

Owns: spelling LLVM IR (opaque pointers, LLVM 22 as shipped with llvmlite 0.50) so the kernel
renderers read as arithmetic, not string formatting. It knows nothing about quant types or targets.

Why hand-written LLVM IR and not numba: numba's vectorizer never emits the int8 multiply-add
instructions (`pmaddubsw`, `pmaddwd`, `vpdpbusd`) these kernels live on; issue 5 measured pure numba
kernels 6-10x slower than the same loops written as LLVM IR with explicit intrinsics.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


def vec(n: int, elem: str) -> str:
    return f"<{n} x {elem}>"


def const_vec(elem: str, values: Sequence[int | float]) -> str:
    """A typed LLVM constant vector, e.g. `<2 x i32> <i32 0, i32 1>` (a shufflevector mask)."""
    values = list(values)
    return f"<{len(values)} x {elem}> <" + ", ".join(f"{elem} {v}" for v in values) + ">"


def splat(elem: str, value: int | float | str) -> str:
    return f"splat ({elem} {value})"


def f32_literal(value: float) -> str:
    """A float constant LLVM accepts exactly: the hex form of its double value."""
    bits = struct.unpack("<Q", struct.pack("<d", float(value)))[0]
    return f"0x{bits:016X}"


@dataclass
class Function:
    """One function being written: `v()` emits an instruction with a fresh SSA result."""

    name: str
    params: Sequence[tuple[str, str]]  # (type, name without %)
    ret: str = "void"
    linkage: str = ""  # e.g. "internal": a helper only its module's functions call
    attributes: str = ""  # function attributes, e.g. "noinline"
    lines: list[str] = field(default_factory=list)
    block: str = "entry"
    _count: int = 0

    def fresh(self, prefix: str = "v") -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def v(self, text: str) -> str:
        """Emit `%new = text` and return `%new`."""
        name = "%" + self.fresh()
        self.lines.append(f"  {name} = {text}")
        return name

    def do(self, text: str) -> None:
        self.lines.append(f"  {text}")

    def label(self, name: str) -> None:
        self.lines.append(f"{name}:")
        self.block = name

    def gep(self, base: str, offset: str | int, elem: str = "i8") -> str:
        return self.v(f"getelementptr inbounds {elem}, ptr {base}, i64 {offset}")

    def load(self, ty: str, ptr: str, align: int = 1) -> str:
        return self.v(f"load {ty}, ptr {ptr}, align {align}")

    def store(self, ty: str, value: str, ptr: str, align: int = 1) -> None:
        self.do(f"store {ty} {value}, ptr {ptr}, align {align}")

    def prefetch(self, base: str, offset: str | int) -> None:
        """A read prefetch into all cache levels; the address may lie past the end of the data (no
        `inbounds`, and prefetches do not fault)."""
        ptr = self.v(f"getelementptr i8, ptr {base}, i64 {offset}")
        self.do(f"call void @llvm.prefetch.p0(ptr {ptr}, i32 0, i32 3, i32 1)")

    def load_f16(self, ptr: str) -> str:
        """A little-endian f16 at ptr, widened to float."""
        h = self.load("half", ptr, 1)
        return self.v(f"fpext half {h} to float")

    def splat_value(self, n: int, elem: str, value: str) -> str:
        one = self.v(f"insertelement <1 x {elem}> poison, {elem} {value}, i64 0")
        return self.v(f"shufflevector <1 x {elem}> {one}, <1 x {elem}> poison, <{n} x i32> zeroinitializer")

    def loop(
        self,
        start: str | int,
        end: str | int,
        carried: Sequence[tuple[str, str]],
        body: Callable[[str, list[str]], list[str]],
        step: int | str = 1,
    ) -> list[str]:
        """for (i = start; i < end; i += step) with values carried through phis; returns their finals.
        `step` is a constant or an i64 value computed before the loop."""
        pre = self.block
        head, loop_body, done = self.fresh("head"), self.fresh("body"), self.fresh("done")
        self.do(f"br label %{head}")
        self.label(head)
        i = "%" + self.fresh("i")
        phis = ["%" + self.fresh("c") for _ in carried]
        phi_at = len(self.lines)
        self.lines.extend([""] * (1 + len(carried)))  # filled once the latch block is known
        cond = self.v(f"icmp slt i64 {i}, {end}")
        self.do(f"br i1 {cond}, label %{loop_body}, label %{done}")
        self.label(loop_body)
        new = body(i, phis)
        nxt = self.v(f"add i64 {i}, {step}")
        latch = self.block
        self.do(f"br label %{head}")
        self.lines[phi_at] = f"  {i} = phi i64 [{start}, %{pre}], [{nxt}, %{latch}]"
        for k, ((ty, init), phi, value) in enumerate(zip(carried, phis, new, strict=True)):
            self.lines[phi_at + 1 + k] = f"  {phi} = phi {ty} [{init}, %{pre}], [{value}, %{latch}]"
        self.label(done)
        return phis

    def render(self) -> str:
        params = ", ".join(f"{t} noalias %{n}" if t == "ptr" else f"{t} %{n}" for t, n in self.params)
        body = "\n".join(self.lines)
        head = " ".join(x for x in ("define", self.linkage, self.ret) if x)
        tail = f" {self.attributes}" if self.attributes else ""
        return f"{head} @{self.name}({params}){tail} {{\nentry:\n{body}\n}}\n"


def module(functions: Sequence[Function], declarations: Sequence[str]) -> str:
    """A module's text: intrinsic declarations, then the functions."""
    return "\n".join(sorted(set(declarations))) + "\n\n" + "\n".join(f.render() for f in functions)


def _half_sum(fn: Function, v: str, n: int) -> str:
    """<n x float> -> <n/2 x float>: the high half plus the low half, lane by lane (f32)."""
    half = n // 2
    hi = fn.v(f"shufflevector <{n} x float> {v}, <{n} x float> poison, {const_vec('i32', range(half, n))}")
    lo = fn.v(f"shufflevector <{n} x float> {v}, <{n} x float> poison, {const_vec('i32', range(half))}")
    return fn.v(f"fadd <{half} x float> {hi}, {lo}")


def reduce_add_16(fn: Function, v: str) -> str:
    """_mm512_reduce_add_ps's order on a <16 x float>: 16 -> 8 -> 4 by halves, then
    (l0 + l2) + (l1 + l3), all f32 (layer_norm_ir.py and moe_ir.py's softmax sums)."""
    v4 = _half_sum(fn, _half_sum(fn, v, 16), 8)
    lane = [fn.v(f"extractelement <4 x float> {v4}, i64 {i}") for i in range(4)]
    even = fn.v(f"fadd float {lane[0]}, {lane[2]}")
    odd = fn.v(f"fadd float {lane[1]}, {lane[3]}")
    return fn.v(f"fadd float {even}, {odd}")
