"""The Python entry points to the generated matmuls: `quantized_matmul(x, raw_weight, wtype)` and, for
F16/BF16/F32 weights, `float_matmul(x, weight, wtype)`.

Owns: choosing and caching compiled kernels per (type, K, variant, tile, order), quantizing (or, for float
weights, rounding) activations with the generated passes, and splitting output columns N across a persistent thread pool
(ctypes releases the GIL for each call). Threads split N only, never K or the rows' reduction, so a
result never depends on the thread count. It does not own scheduling a whole forward pass: issue 5's
compiled step function replaces the one-Python-call-per-matmul here.
"""

from __future__ import annotations

import ctypes
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu import float_matmul_ir as F
from kinetic.codegen.cpu.activation_ir import render_quantize, render_round
from kinetic.codegen.cpu.jit import Jit, default_jit
from kinetic.codegen.cpu.matmul_ir import ordered_layout, render_matmul
from kinetic.codegen.cpu.quant_blocks import LAYOUTS
from kinetic.codegen.cpu.target import host

SUPPORTED = frozenset(LAYOUTS)
DEFAULT_TILE = 8

_P = ctypes.c_void_p
_I = ctypes.c_int64
MATMUL_SIG = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _P, _I, _I, _I, _I)
QUANT_SIG = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _I)


@dataclass(frozen=True)
class QuantizedActivations:
    """Activation rows as a quantized dot reads them: q i8 [M, K], d f32 [M, K/block], extra or None."""

    fmt: str
    q: np.ndarray
    d: np.ndarray
    extra: np.ndarray | None  # q8_1: s f32 [M, K/32]; q8_k: sums of 16 i32 [M, K/16]


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


@cache
def _quantizer(fmt: str, jit: Jit):
    ir, name = render_quantize(fmt)
    return QUANT_SIG(jit.address(ir, name))


def _kernel(wtype: Q, k: int, variant: str, tile: int, jit: Jit, wide: bool = True, order: str | None = None):
    """The compiled kernel; `order` (kinetic/ir/orders.py's name; None: the type's ggml order) is
    cached as None where it is the type's ggml order, so its name and None share one kernel."""
    other = ordered_layout(wtype, order).dot_order is not None  # raises for an order without a kernel
    return _cached_kernel(wtype, k, variant, tile, jit, wide, order if other else None)


@cache
def _cached_kernel(wtype: Q, k: int, variant: str, tile: int, jit: Jit, wide: bool, order: str | None):
    ir, name = render_matmul(wtype, k, variant, tile, wide=wide, order=order)
    return MATMUL_SIG(jit.address(ir, name))


@cache
def _float_kernel(wtype: Q, k: int, variant: str, jit: Jit):
    ir, name = F.render_float_matmul(wtype, k, variant, host().features)
    return MATMUL_SIG(jit.address(ir, name))


@cache
def _rounder(fmt: str, jit: Jit):
    return QUANT_SIG(jit.address(*render_round(fmt)))


def quantize_activations(x: np.ndarray, fmt: str, jit: Jit | None = None) -> QuantizedActivations:
    """f32 [M, K] -> the 8-bit blocks of `fmt` ("q8_0", "q8_1" or "q8_k")."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    m, k = x.shape
    block = 256 if fmt == "q8_k" else 32
    if k % block:
        raise ValueError(f"{fmt} activations need K a multiple of {block}, got {k}")
    q = np.empty((m, k), np.int8)
    d = np.empty((m, k // block), np.float32)
    extra = {"q8_1": np.empty((m, k // 32), np.float32), "q8_k": np.empty((m, k // 16), np.int32)}.get(fmt)
    _quantizer(fmt, jit or default_jit())(_ptr(x), _ptr(q), _ptr(d), _ptr(extra), m * (k // block))
    return QuantizedActivations(fmt, q, d, extra)


@cache
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=threads - 1, thread_name_prefix="kinetic-cpu")


def split_columns(n: int, threads: int) -> list[tuple[int, int]]:
    """Contiguous [n0, n1) ranges, one per thread, sizes differing by at most one."""
    bounds = [n * t // threads for t in range(threads + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def quantized_matmul(
    x: np.ndarray,
    raw_weight: np.ndarray,
    wtype: Q,
    *,
    threads: int = 1,
    variant: str | None = None,
    tile: int = DEFAULT_TILE,
    wide: bool = True,
    jit: Jit | None = None,
    order: str | None = None,
) -> np.ndarray:
    """x f32 [M, K] times the quantized weight u8 [N, row_bytes] transposed -> f32 [M, N]. `wide`
    False keeps full tiles off the 512-bit paths (the same bits; for comparisons). `order`: the
    reduction order (kinetic/ir/orders.py: "block_chain" for issue 23's fast mode), None for the
    type's ggml order; ValueError where the type's kernels do not follow it."""
    jit = jit or default_jit()
    layout = LAYOUTS[Q(wtype)]
    variant = variant or host().best_variant()
    x = np.ascontiguousarray(x, dtype=np.float32)
    m, k = x.shape
    w = np.ascontiguousarray(raw_weight, dtype=np.uint8)
    if w.ndim != 2 or w.shape[1] != k // layout.block * layout.block_bytes or k % layout.block:
        raise ValueError(f"{layout.wtype.name} weight of shape {w.shape} does not match K={k}")
    acts = quantize_activations(x, layout.activation, jit)
    out = np.empty((m, w.shape[0]), np.float32)
    kernel = _kernel(layout.wtype, k, variant, tile, jit, wide, order)
    _split(kernel, (_ptr(w), _ptr(acts.q), _ptr(acts.d), _ptr(acts.extra), _ptr(out), m), w.shape[0], threads)
    return out


def _split(kernel, args: tuple, n: int, threads: int) -> None:
    """kernel(*args, n0, n1, n) over the threads' column ranges; the caller runs the first."""
    ranges = split_columns(n, threads)
    futures = [_pool(threads).submit(kernel, *args, n0, n1, n) for n0, n1 in ranges[1:]]
    for n0, n1 in ranges[:1]:
        kernel(*args, n0, n1, n)
    for f in futures:
        f.result()


def round_activations(x: np.ndarray, wtype: Q, jit: Jit | None = None) -> np.ndarray:
    """f32 [M, K] -> what a float kernel of `wtype` reads: F16: f16 values as f32 [M, K]; BF16: bf16
    bits u16 [M, K]; F32: x itself."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if Q(wtype) is Q.F32:
        return x
    fmt = Q(wtype).name.lower()
    y = np.empty(x.shape, np.float32 if fmt == "f16" else np.uint16)
    _rounder(fmt, jit or default_jit())(_ptr(x), None, None, _ptr(y), x.size)
    return y


def float_matmul(
    x: np.ndarray, weight: np.ndarray, wtype: Q, *, threads: int = 1, variant: str | None = None, jit: Jit | None = None
) -> np.ndarray:
    """x f32 [M, K] times a float weight [N, K] transposed -> f32 [M, N], bit for bit
    numerics.float_dot. `weight` holds the stored values: f16, bf16 bit patterns (u16) or f32."""
    jit = jit or default_jit()
    wtype = Q(wtype)
    variant = variant or F.best_variant(wtype, host().flags)
    x = np.ascontiguousarray(x, dtype=np.float32)
    m, k = x.shape
    w = np.ascontiguousarray(weight)
    if w.ndim != 2 or w.shape[1] * w.itemsize != k * F.WEIGHT_BYTES[wtype]:
        raise ValueError(f"{wtype.name} weight of shape {w.shape} ({w.dtype}) does not match K={k}")
    acts = round_activations(x, wtype, jit)
    out = np.empty((m, w.shape[0]), np.float32)
    _split(_float_kernel(wtype, k, variant, jit), (_ptr(w), _ptr(acts), None, None, _ptr(out), m), w.shape[0], threads)
    return out
