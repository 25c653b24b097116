"""Helpers for the CUDA kernel tests: the kernel set under test, random weights, and running a matmul,
norm, rotary, elementwise, attention or gather op through kernels on either the host emulation or a
GPU (both have `launch(name, rows, *args)`; `xp` is numpy or cupy)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.common.tables import RopeTables
from kinetic.codegen.cuda import attention, embed, emulator, gather, gemv, pointwise, quantize
from kinetic.ir import numerics

# byte offsets of each layout's f16 scale fields; every other byte pattern is a valid encoding
F16_FIELDS = {Q.Q8_0: (0,), Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.IQ4_NL: (0,), Q.Q4_K: (0, 2),
              Q.Q6_K: (208,), Q.Q5_K: (0, 2), Q.Q3_K: (108,), Q.Q2_K: (80, 82)}
BLOCK_BYTES = {Q.Q8_0: 34, Q.Q4_0: 18, Q.Q4_1: 20, Q.Q5_0: 22, Q.Q5_1: 24, Q.IQ4_NL: 18, Q.Q4_K: 144, Q.Q6_K: 210,
               Q.Q5_K: 176, Q.Q3_K: 110, Q.Q2_K: 84}
TYPES = sorted(gemv.SUPPORTED, key=lambda t: t.name)
FLOAT_TYPES = sorted(gemv.FLOAT, key=lambda t: t.name)  # float weights: the GEMV reads f32 rows
# the formats added for the popular K-quant mixes and float tensors (test_cuda_weight_types.py), with
# their test shapes: 13 outputs (not a block's 4), widths of 256 and 512 (F16 also one of 64k + 32)
WEIGHT_TYPE_CASES = {Q.Q5_K: [(13, 256), (13, 512)], Q.Q3_K: [(13, 256), (13, 512)],
                     Q.Q2_K: [(13, 256), (13, 512)], Q.F16: [(13, 256), (13, 512), (5, 352)],
                     Q.BF16: [(13, 256), (13, 512), (5, 352)],
                     # F32: whole chunks; tails of 36 (rounded products, then 4 fmas), 6 (fmas only), 40 (no chunk)
                     Q.F32: [(13, 256), (13, 100), (5, 70), (5, 40)]}

# (n_out, k) per type: outputs below, at and above a block's 16 (block-32) or 4 (super-block) outputs,
# one block and several
GEMV_SHAPES = {t: [(1, 32), (16, 64), (37, 352)] for t in gemv.BLOCK32} | {
    t: [(1, 256), (4, 256), (13, 768)] for t in gemv.SUPERBLOCK}
GEMM_SENTINEL = 0x7FC0DEAD  # the bits of a NaN no kernel computes: y rows a GEMM must not write
ELEMENTWISE_WIDTH = 300  # not a multiple of the 256 threads of a block
SCALE_FACTOR = 0.3  # not a power of two: the product rounds
NORMS = [(512, 1e-5, 0, True), (384, 1e-6, 64, False), (96, 1e-6, 32, True)]  # width, eps, group, weighted
ROPES = [(4, 64, 64, True), (4, 64, 32, False), (3, 32, 16, True)]  # n_head, head_dim, n_rot, neox
ATTENTIONS = [(4, 2, 64), (2, 1, 128), (3, 3, 256)]  # n_head, n_kv_head, head_dim (GQA, MHA, Gemma's 256)
CACHE_CAPACITY = 48  # rows of the test KV cache, and so the attention kernels' mask stride
TABLE_WIDTH = 512  # the embedding tables of the K-quant and float types: two super-blocks
EMBED_WIDTHS = (32, 288)  # one block of 32; more values than a thread block's 256, the last one partial
TAKE_ROWS_WIDTHS = (300,)  # not a multiple of the 256 threads of a block
KV_STORE_WIDTHS = (128, 300)  # n_kv_head * head_dim of the attention shapes, and one not filling a block
QUANTIZE_WIDTHS = {"q8_0": (32, 352), "q8_1": (32, 352), "q8_k": (256, 768)}


def kernels_under_test() -> list:
    """Every kernel the tests run, at the shapes above."""
    ks = [gemv.gemv(t, n, k) for t in TYPES for n, k in GEMV_SHAPES[t]]
    ks += [gemv.gemm(t, n, k) for t in TYPES for n, k in GEMV_SHAPES[t]]
    ks += [make(t, n, k) for make in (gemv.gemv, gemv.gemm) for t, shapes in WEIGHT_TYPE_CASES.items()
           for n, k in shapes]
    ks += [quantize.quantize(fmt, k) for fmt, widths in QUANTIZE_WIDTHS.items() for k in widths]
    ks += [quantize.quantize(gemv.activation_format(t), k) for t in TYPES for _, k in GEMV_SHAPES[t]]
    ks += [quantize.quantize(gemv.activation_format(t), k) for t, shapes in WEIGHT_TYPE_CASES.items()
           if t not in gemv.FLOAT for _, k in shapes]
    ks += [pointwise.elementwise(op, ELEMENTWISE_WIDTH, SCALE_FACTOR) for op in pointwise.ELEMENTWISE]
    ks += [pointwise.rms_norm(w, eps, g, weighted) for w, eps, g, weighted in NORMS]
    ks += [pointwise.rope(*r) for r in ROPES]
    ks += [kind(nh, nkv, hd, attention_scale(hd), mask_stride=CACHE_CAPACITY)
           for nh, nkv, hd in ATTENTIONS for kind in (attention.attention, attention.attention_rows)]
    ks += [gather.embed_q8_0(w) for w in EMBED_WIDTHS]
    ks += [embed.embed(t, TABLE_WIDTH) for t in sorted(embed.SUPPORTED - {Q.Q8_0}, key=lambda t: t.name)]
    ks += [gather.take_rows(w) for w in TAKE_ROWS_WIDTHS]
    ks += [gather.kv_store(w) for w in KV_STORE_WIDTHS]
    return ks


def attention_scale(head_dim: int) -> float:
    return float(np.float32(1 / np.sqrt(head_dim)))


def random_weight(rng: np.random.Generator, wtype: Q, n: int, k: int) -> np.ndarray:
    """u8 [n, row_bytes]: random quant bytes with f16 scales drawn from N(0, 0.02) (signed, like real
    minimums); float weights: N(0, 1) values with signed zeros, a subnormal and the largest value."""
    if wtype is Q.F16:
        values = rng.standard_normal((n, k)).astype(np.float16)
        values.reshape(-1)[:4] = [0.0, -0.0, 6e-8, 65504.0]
        return values.view(np.uint8)
    if wtype is Q.F32:  # N(0, 1) values, signed zeros, a subnormal
        values = rng.standard_normal((n, k)).astype(np.float32)
        values.reshape(-1)[:3] = [0.0, -0.0, 1e-40]
        return values.view(np.uint8).reshape(n, -1)
    if wtype is Q.BF16:  # the top halves of f32 values (truncated: any 16 bits are a bf16)
        bits = (rng.standard_normal((n, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        bits.reshape(-1)[:5] = [0x0000, 0x8000, 0x0001, 0x807F, 0x7F7F]  # zeros, subnormals, the largest
        return bits.view(np.uint8)
    block = 256 if wtype in gemv.SUPERBLOCK else 32
    blocks = rng.integers(0, 256, (n, k // block, BLOCK_BYTES[wtype]), dtype=np.uint8)
    for off in F16_FIELDS[wtype]:
        scales = (rng.standard_normal(blocks.shape[:2]) * 0.02).astype(np.float16)
        blocks[:, :, off : off + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(n, -1)


def reference_matmul(x: np.ndarray, raw: np.ndarray, wtype: Q) -> np.ndarray:
    return numerics.matmul(x, numerics.DequantizedWeight(raw, wtype))


def quantize_rows(prog, xp, x, fmt: str):
    """The quantizer kernel's outputs for rows x: [xq, xd] (plus xs for Q8_1); a float format's
    GEMV reads the f32 rows themselves: [x]."""
    if fmt in ("f16", "bf16", "f32"):
        return [xp.asarray(x)]
    rows, k = x.shape
    block = 256 if fmt == "q8_k" else 32
    outs = [xp.zeros((rows, k), xp.int8), xp.zeros((rows, k // block), xp.float32)]
    if fmt == "q8_1":
        outs.append(xp.zeros((rows, k // 32), xp.float32))
    prog.launch(quantize.quantize(fmt, k).name, rows, xp.asarray(x), *outs)
    return outs


def kernel_matmul(prog, xp, x, raw, wtype: Q):
    """f32 [rows, n_out]: the quantizer kernel, then the GEMV kernel."""
    return kernel_gemv(prog, xp, quantize_rows(prog, xp, x, gemv.activation_format(wtype)), raw, wtype)


def kernel_gemv(prog, xp, acts, raw, wtype: Q):
    """f32 [rows, n_out]: the GEMV kernel on quantized rows acts (quantize_rows' outputs)."""
    rows, k = acts[0].shape
    y = xp.zeros((rows, raw.shape[0]), xp.float32)
    prog.launch(gemv.gemv(wtype, raw.shape[0], k).name, rows, xp.asarray(raw), *acts, y)
    return y


def gemm_rows(wtype: Q) -> tuple[int, ...]:
    """Row counts for a GEMM test: one row, a tile less one, a tile, a tile and one, two tiles and
    three (a partial last tile)."""
    tile = gemv.GEMM_ROWS[wtype]
    return 1, tile - 1, tile, tile + 1, 2 * tile + 3


def kernel_gemm(prog, xp, acts, raw, wtype: Q):
    """f32 [whole tiles, n_out]: the GEMM kernel on quantized rows acts (quantize_rows' outputs, their
    row count n_rows) into a y padded to whole tiles and filled with GEMM_SENTINEL's bits, so rows
    n_rows.. show whether anything was written there."""
    kernel = gemv.gemm(wtype, raw.shape[0], acts[0].shape[1])
    n_rows = acts[0].shape[0]
    tiles = -(-n_rows // kernel.rows_per_block)
    y = xp.full((tiles * kernel.rows_per_block, raw.shape[0]), GEMM_SENTINEL, xp.uint32).view(xp.float32)
    prog.launch(kernel.name, n_rows, xp.asarray(raw), *acts, y, n_rows)
    return y


def elementwise_case(op: str, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """(the second operand an elementwise kernel of `op` reads, or None; the interpreter's value of it
    on a and b). A broadcast op (add_bias) reads one row, b[0]; its reference reads that row as a
    weight, so its value here is the one f32 add a value that reference makes."""
    from kinetic.ir.interpreter import evaluate
    from kinetic.ir.ops import Op, ScaleAttrs, SoftcapAttrs

    attrs = {"scale": ScaleAttrs(SCALE_FACTOR), "softcap": SoftcapAttrs(SCALE_FACTOR)}.get(op)
    with np.errstate(all="ignore"):
        if op in pointwise.BROADCAST:
            return b[0], (a + b[0]).astype(np.float32)
        ref = evaluate(Op(op), [a, b], attrs)
    return (b if pointwise.ELEMENTWISE[op][0] == 2 else None), ref


def kernel_elementwise(prog, xp, op: str, a, b=None):
    kernel = pointwise.elementwise(op, a.shape[1], SCALE_FACTOR)
    out = xp.zeros(a.shape, xp.float32)
    args = [xp.asarray(a)] + ([xp.asarray(b)] if b is not None else [])
    if op in ("gelu", "geglu"):
        args.append(xp.asarray(numerics.gelu_table().view(np.uint16)))
    prog.launch(kernel.name, a.shape[0], *args, out)
    return out


def kernel_rms_norm(prog, xp, x, eps, group, weight=None):
    kernel = pointwise.rms_norm(x.shape[1], eps, group, weighted=weight is not None)
    out = xp.zeros(x.shape, xp.float32)
    args = [xp.asarray(x)] + ([xp.asarray(weight)] if weight is not None else [])
    prog.launch(kernel.name, x.shape[0], *args, out)
    return out


def kernel_rope(prog, xp, x, positions, n_head, head_dim, n_rot, neox, theta=10000.0, rotary=None):
    """The rope kernel over the tables the CUDA runner uploads (common/tables.py: RopeTables of the
    node's rotary key, plain at `theta` unless `rotary` is given)."""
    cos, sin = RopeTables(rotary or numerics.Rotary(n_rot, theta)).rows(np.asarray(positions))
    out = xp.zeros(x.shape, xp.float32)
    kernel = pointwise.rope(n_head, head_dim, n_rot, neox)
    prog.launch(kernel.name, x.shape[0], xp.asarray(x), xp.asarray(np.ascontiguousarray(cos)),
                xp.asarray(np.ascontiguousarray(sin)), out)
    return out


def edge_values(rng: np.random.Generator, rows: int, width: int) -> np.ndarray:
    """f32 [rows, width]: N(0, 16) with the first row's head replaced by values at the ops' edges
    (signed zeros, subnormals, the GELU cut-offs at +-10, exp's saturation, f16 overflow)."""
    x = (rng.standard_normal((rows, width)) * 4).astype(np.float32)
    edges = [0.0, -0.0, 1e-40, -1e-40, 88.0, -88.0, 100.0, -100.0, 9.99, -9.99, 10.0, -10.0, 1e30, -1e30,
             0.5, 3e-8, 65519.0, 70000.0, -3.4e38, 1e-7, 133.0, -133.0, 89.5, -104.0]
    x[0, : len(edges)] = edges
    return x


def kernel_attention(prog, xp, q, keys, values, visible, n_head, n_kv_head, head_dim, n_keys=None,
                     cache_rows=None):
    """Attention of rows q over the first n_keys (default: all) rows of f16 keys/values [n,
    n_kv_head*head_dim] where visible [rows, <= CACHE_CAPACITY] says; the mask is padded with zeros
    to the kernel's stride, meta is [n_keys, 0]; cache_rows [rows] (default 0): the key row each
    row's cache starts at (kv_rows' second column)."""
    kernel = attention.attention(n_head, n_kv_head, head_dim, attention_scale(head_dim), mask_stride=CACHE_CAPACITY)
    mask = np.zeros((q.shape[0], CACHE_CAPACITY), np.uint8)
    mask[:, : visible.shape[1]] = visible
    meta = np.array([keys.shape[0] if n_keys is None else n_keys, 0], np.int32)
    kv_rows = np.zeros((q.shape[0], 2), np.int32)
    kv_rows[:, 1] = 0 if cache_rows is None else cache_rows
    out = xp.zeros(q.shape, xp.float32)
    prog.launch(kernel.name, q.shape[0], xp.asarray(q), xp.asarray(keys.view(np.uint16)),
                xp.asarray(values.view(np.uint16)), xp.asarray(mask), xp.asarray(meta), xp.asarray(kv_rows), out)
    return out


def reference_attention(q, keys, values, visible, n_head, n_kv_head, head_dim):
    from kinetic.ir.ops import AttentionAttrs

    attrs = AttentionAttrs(n_head=n_head, n_kv_head=n_kv_head, head_dim=head_dim, scale=attention_scale(head_dim))
    return numerics.attention_online(q, keys, values, visible, attrs)


def attention_inputs(rng, rows: int, n_keys: int, n_head: int, n_kv_head: int, head_dim: int):
    """q, f16 keys and values, and a causal visibility (row r sees keys up to n_keys - rows + r) with
    one hole, so a new maximum, a rescale and a skipped key all occur."""
    q = (rng.standard_normal((rows, n_head * head_dim)) * 2).astype(np.float32)
    keys = rng.standard_normal((n_keys, n_kv_head * head_dim)).astype(np.float16)
    values = rng.standard_normal((n_keys, n_kv_head * head_dim)).astype(np.float16)
    visible = np.zeros((rows, n_keys), bool)
    for r in range(rows):
        visible[r, : n_keys - rows + r + 1] = True
    visible[rows - 1, 3] = False
    return q, keys, values, visible


def cache_with_garbage(rng, keys, values, visible, capacity: int = CACHE_CAPACITY):
    """The cache buffers of a runtime holding len(keys) keys: keys and values [capacity, width] whose
    rows past the keys hold f16 garbage (random bits: NaNs, infinities, huge values), and a mask
    [rows, capacity] that marks every garbage key visible. Attention must not read any of it."""
    n, rows = keys.shape[0], visible.shape[0]
    pad = [rng.integers(0, 65536, (capacity - n, keys.shape[1])).astype(np.uint16).view(np.float16)
           for _ in range(2)]
    mask = np.ones((rows, capacity), bool)
    mask[:, :n] = visible
    return np.concatenate([keys, pad[0]]), np.concatenate([values, pad[1]]), mask


def random_q8_0_table(rng: np.random.Generator, n_rows: int, width: int) -> np.ndarray:
    """u8 [n_rows, width/32*34]: random Q8_0 rows whose f16 scales are random finite bit patterns
    (subnormals, signed zeros and the largest magnitudes included) in the first half of the rows and
    N(0, 0.02) draws, like a real table's, in the second."""
    table = random_weight(rng, Q.Q8_0, n_rows, width).reshape(n_rows, -1, 34)
    bits = rng.integers(0, 65536, table.shape[:2]).astype(np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] &= 0x83FF  # infinities and NaNs become subnormals
    bits.reshape(-1)[:4] = [0x0000, 0x8000, 0x0001, 0xFBFF]  # +0, -0, the smallest subnormal, -65504
    half = n_rows // 2 or n_rows
    table[:half, :, :2] = bits[:half].view(np.uint8).reshape(half, -1, 2)
    return table.reshape(n_rows, -1)


def kernel_embed(prog, xp, table, tokens):
    """f32 [len(tokens), width]: the Q8_0 table's rows tokens, dequantized by the kernel."""
    width = table.shape[1] // 34 * 32
    out = xp.zeros((len(tokens), width), xp.float32)
    prog.launch(gather.embed_q8_0(width).name, len(tokens), xp.asarray(table),
                xp.asarray(np.asarray(tokens, np.int32)), out)
    return out


def kernel_take_rows(prog, xp, x, index):
    out = xp.zeros((len(index), x.shape[1]), xp.float32)
    prog.launch(gather.take_rows(x.shape[1]).name, len(index), xp.asarray(x), xp.asarray(np.asarray(index, np.int32)),
                out)
    return out


def kernel_kv_store(prog, xp, x, cache, base_slot: int):
    """The cache (u16 [capacity, width], copied) after the kernel stored x's rows from base_slot on."""
    cache = xp.asarray(cache).copy()
    kv_rows = np.stack([base_slot + np.arange(x.shape[0]), np.zeros(x.shape[0])], axis=1).astype(np.int32)
    prog.launch(gather.kv_store(x.shape[1]).name, x.shape[0], xp.asarray(x), xp.asarray(kv_rows), cache)
    return cache


def f16_rounding_cases(width: int) -> np.ndarray:
    """f32 [n, width]: for every finite f16 value of either sign the f32 midpoint to the next magnitude
    (a tie, also between subnormals and into the overflow at 65520), each midpoint's neighbours one
    f32 ulp either side, and edge values (f32 subnormals, the largest f16, overflow, infinities)."""
    h = np.arange(0, 0x7C00, dtype=np.uint32)  # every non-negative finite f16 bit pattern
    lo = h.astype(np.uint16).view(np.float16).astype(np.float64)
    hi = (h + 1).astype(np.uint16).view(np.float16).astype(np.float64)  # 0x7C00 is infinity: use 65536
    hi[-1] = 65536.0
    mid = ((lo + hi) / 2).astype(np.float32)  # exact: a midpoint of two f16 values fits f32
    bits = mid.view(np.uint32)
    near = np.concatenate([mid, (bits - 1).view(np.float32), (bits + 1).view(np.float32)])
    edges = np.array([0.0, 1e-40, 2.0**-25, 3 * 2.0**-25, 2.0**-24, 2.0**-14, 65504.0, 65519.99, 65520.0, 1e30,
                      3.4e38, np.inf, 1.0, 0.1, 3.14159], np.float32)
    values = np.concatenate([near, edges])
    values = np.concatenate([values, -values])
    pad = -len(values) % width
    return np.concatenate([values, np.zeros(pad, np.float32)]).reshape(-1, width)


def host_programs(kernels: Callable[[], list], cache_name: str):
    """A module-scoped fixture (bound to the name it is assigned to): `kernels()` compiled for the
    host emulation, warps and lanes walked in one order, then the other; skips without a compiler."""

    @pytest.fixture(scope="module", params=[False, True], ids=["reverse", "forward"])
    def program(request, tmp_path_factory) -> emulator.HostProgram:
        reason = emulator.unavailable_reason()
        if reason:
            pytest.skip(reason)
        return emulator.HostProgram(kernels(), forward=request.param, cache_dir=tmp_path_factory.mktemp(cache_name))

    return program
