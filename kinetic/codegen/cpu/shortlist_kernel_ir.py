"""Renders Shortlist's copy-scoring kernel: every row's upper-bound score from the blocked 4-bit copy.

Owns: the copy's memory layout ("lane blocks") and the LLVM IR of the kernel that scores it, plus
`groups(n_blocks)` and the packers that put weight codes and activations into that layout. Does not
own making the copy or its bound (shortlist_copy.py), nor when the kernel runs (shortlist.py).

Why a kernel of its own and not Q4_0's: the copy's score needs no particular float order (its error
is bounded whatever the order, docs/shortlist.md), so it is free of ggml's per-block fma chain. The
layout puts one 32-wide block in each 32-bit lane of a vector: step t (0..7) of a group of G blocks
(G = 16, 8 or 4 lanes) holds elements 4t..4t+3 of each of the G blocks, so `vpdpbusd` accumulates
each block's exact integer sum in its own lane, and the float work is one convert, two multiplies
and a tree sum per G blocks instead of an fma chain per block:

    for each row n in [n0, n1):
        for each group of G blocks (16s, then 8, then 4; the row's blocks padded to a multiple of 4):
            I     = -8 * (the block's activation sum)                          # the codes' offset 8
            I    += dot(codes, activations)  over the 8 steps (vpdpbusd: u8 code x s8 activation)
            part  = (float(I) * d_x) * d_w                                     # per lane = block
            score += tree sum of part's lanes
        out[n] = score

Bytes of a group: 4 step pairs of 4G bytes, byte 4j+e of pair u holding block j's element 8u+e in
its low nibble and element 8u+4+e in its high nibble (unsigned codes 0..15, value d_w * (code - 8)).
The activations come permuted into the same steps (`pack_activations`), padding blocks hold zero
scales and zero activations. The integer sums are exact (|I| <= 32 * 8 * 127 < 2^24, so float(I)
is exact too); the `generic` variant computes the same integers without VNNI.
"""

from __future__ import annotations

import numpy as np

from kinetic.codegen.cpu.llvm_ir import Function, module, splat

BLOCK = 32
STEPS = 8  # 4 elements of each block per step
WIDTHS = (16, 8, 4)  # lanes (blocks) per group, widest first
# Each row prefetches the codes PREFETCH_BYTES ahead (and the scales as far ahead in rows): Gemma 3's
# 262,144 rows of 640, min of 40 scans under load, 2 threads 2.37 -> 1.76 ms, 1 thread 3.21 -> 2.65
# (2,048 ahead: 2.21 and 3.24); the scan is bound by memory, and the hardware prefetcher alone kept
# it at about 35 GB/s where the machine reads 45-50.
PREFETCH_BYTES = 8192


def groups(n_blocks: int) -> list[int]:
    """The group sizes covering n_blocks blocks, padded up to a multiple of 4: 20 -> [16, 4]."""
    left = -(-n_blocks // 4) * 4
    out = []
    for width in WIDTHS:
        while left >= width:
            out.append(width)
            left -= width
    return out


def padded_blocks(n_blocks: int) -> int:
    return sum(groups(n_blocks))


def pack_codes(codes: np.ndarray) -> np.ndarray:
    """Codes u8 [n, blocks, 32] (0..15) -> the layout's bytes u8 [n, padded blocks * 16] (pads: 8)."""
    n, nb, _ = codes.shape
    padded = np.full((n, padded_blocks(nb), BLOCK), 8, np.uint8)
    padded[:, :nb] = codes
    parts, start = [], 0
    for width in groups(nb):
        steps = padded[:, start:start + width].reshape(n, width, STEPS, 4).transpose(0, 2, 1, 3)  # [n, 8, G, 4]
        parts.append((steps[:, 0::2] | (steps[:, 1::2] << 4)).reshape(n, -1))
        start += width
    return np.concatenate(parts, axis=1)


def pack_activations(q: np.ndarray) -> np.ndarray:
    """One row's q8 values i8 [blocks * 32] -> the layout's steps i8 [padded blocks * 32] (pads: 0);
    any other dtype is moved alike (shortlist_scan packs element numbers to find where each goes)."""
    nb = q.size // BLOCK
    padded = np.zeros((padded_blocks(nb), BLOCK), q.dtype)
    padded[:nb] = q.reshape(nb, BLOCK)
    parts, start = [], 0
    for width in groups(nb):
        parts.append(padded[start:start + width].reshape(width, STEPS, 4).transpose(1, 0, 2).reshape(-1))
        start += width
    return np.concatenate(parts)


PARAMS = [
    ("ptr", "codes"),  # u8 [N, padded blocks * 16]
    ("ptr", "scales"),  # f16 [N, padded blocks], d_w
    ("ptr", "xp"),  # i8 [padded blocks * 32], pack_activations
    ("ptr", "xinit"),  # i32 [padded blocks], -8 * each block's activation sum
    ("ptr", "xd"),  # f32 [padded blocks], d_x (0 for pads)
    ("ptr", "out"),  # f32 [N]
    ("i64", "n0"),
    ("i64", "n1"),
    ("i64", "n"),  # unused: the thread split's signature (matmul._split)
]


def _dot_steps(fn: Function, variant: str, acc: str, codes: str, x: str, width: int) -> str:
    """acc + per lane the sum of its 4 code x activation products (exact int32)."""
    b, v = 4 * width, f"<{width} x i32>"
    if variant == "vnni":
        return fn.v(f"call {v} @llvm.x86.avx512.vpdpbusd.{32 * width}({v} {acc}, <{b} x i8> {codes}, <{b} x i8> {x})")
    a = fn.v(f"zext <{b} x i8> {codes} to <{b} x i32>")
    s = fn.v(f"sext <{b} x i8> {x} to <{b} x i32>")
    p = fn.v(f"mul <{b} x i32> {a}, {s}")
    for e in range(4):
        mask = "<" + ", ".join(f"i32 {4 * j + e}" for j in range(width)) + ">"
        lanes = fn.v(f"shufflevector <{b} x i32> {p}, <{b} x i32> poison, <{width} x i32> {mask}")
        acc = fn.v(f"add {v} {acc}, {lanes}")
    return acc


def _group(fn: Function, variant: str, crow: str, srow: str, first: int, width: int) -> str:
    """One group's float sum of (float(I) * d_x) * d_w over its lanes."""
    b, v, f = 4 * width, f"<{width} x i32>", f"<{width} x float>"
    acc = fn.load(v, fn.gep("%xinit", first, "i32"), 4)
    for u in range(STEPS // 2):
        packed = fn.load(f"<{b} x i8>", fn.gep(crow, first * 16 + u * b), 1)
        low = fn.v(f"and <{b} x i8> {packed}, {splat('i8', 15)}")
        high = fn.v(f"lshr <{b} x i8> {packed}, {splat('i8', 4)}")
        for codes, step in ((low, 2 * u), (high, 2 * u + 1)):
            x = fn.load(f"<{b} x i8>", fn.gep("%xp", first * BLOCK + step * b), 1)
            acc = _dot_steps(fn, variant, acc, codes, x, width)
    exact = fn.v(f"sitofp {v} {acc} to {f}")
    scaled = fn.v(f"fmul {f} {exact}, " + fn.load(f, fn.gep("%xd", first, "float"), 4))
    halves = fn.load(f"<{width} x half>", fn.gep(srow, first, "half"), 2)
    part = fn.v(f"fmul {f} {scaled}, " + fn.v(f"fpext <{width} x half> {halves} to {f}"))
    return fn.v(f"call reassoc float @llvm.vector.reduce.fadd.v{width}f32(float -0.0, {f} {part})")


def kernel_name(n_blocks: int, variant: str) -> str:
    return f"kin_shortlist4_b{n_blocks}_{variant}"


def render_scorer(n_blocks: int, variant: str) -> tuple[str, str]:
    """(module IR text, function name): out[n] = the copy's score of row n, for rows [n0, n1)."""
    fn = Function(kernel_name(n_blocks, variant), PARAMS)
    sizes = groups(n_blocks)
    row_bytes, row_scales = sum(sizes) * 16, sum(sizes)

    def row(n: str, _carried: list[str]) -> list[str]:
        crow = fn.gep("%codes", fn.v(f"mul i64 {n}, {row_bytes}"))
        srow = fn.gep("%scales", fn.v(f"mul i64 {n}, {row_scales}"), "half")
        for line in range(0, row_bytes, 64):
            fn.prefetch(crow, PREFETCH_BYTES + line)
        fn.prefetch(srow, PREFETCH_BYTES * 2 * row_scales // row_bytes)  # the same rows ahead (2-byte scales)
        total, first = None, 0
        for width in sizes:
            part = _group(fn, variant, crow, srow, first, width)
            total = part if total is None else fn.v(f"fadd float {total}, {part}")
            first += width
        fn.store("float", total, fn.gep("%out", n, "float"), 4)
        return []

    fn.loop("%n0", "%n1", [], row)
    fn.do("ret void")
    declarations = [f"declare float @llvm.vector.reduce.fadd.v{w}f32(float, <{w} x float>)" for w in WIDTHS]
    declarations.append("declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")
    if variant == "vnni":
        declarations += [f"declare <{w} x i32> @llvm.x86.avx512.vpdpbusd.{32 * w}(<{w} x i32>, <{4 * w} x i8>, "
                         f"<{4 * w} x i8>)" for w in WIDTHS]
    return module([fn], declarations), fn.name
