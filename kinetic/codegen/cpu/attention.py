"""Compiled attention for the CPU device, bit for bit `numerics.attention_online`.

Owns: `attention_online(q, keys, vals, visible, a)`, a numba-compiled loop giving exactly the
reference's floats for an f16 cache (other cache types run through the reference). The reference
vectorizes over rows and loops over keys in Python; this loops over rows, heads and keys in machine
code, repeating every rounding step of the reference in the same order:

* q rounded to f16 (numpy, before the loop), keys and values widened to f32 (exact);
* the score: `numerics.dot_f16`'s order (64 lanes fed by f32(f64 product + lane), lanes folded as
  (a0+a2)+(a1+a3), halves 16->8->4, (l0+l2)+(l1+l3), a float64 tail past the last chunk of 64);
* scale (or scale/cap, C library tanhf, cap * t) in f32;
* the online softmax with the C library's expf (numba lowers `math.exp`/`math.tanh` on float32 to
  calls of the process's `expf`/`tanhf`, the very functions the reference reaches through ctypes;
  tests/codegen/cpu/test_cpu_attention.py checks this on millions of inputs);
* on a new maximum acc = f16(f32(acc * ms)); then acc = f16(f32(acc + v * vs)) (the float64 sum
  the reference forms, rounded to f32, then to f16); S = f32(S * ms + vs) in float64 (the
  reference's `fma_f32`, not a hardware fma);
* out = acc * (1/S), 1/S = 0 where S == 0.

Each (row, head) runs on its own, so a row's result never depends on the other rows. No fastmath:
LLVM keeps every multiply and add separately rounded.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from kinetic.ir import numerics

F32 = np.float32


@intrinsic
def _bits(typingctx, x):
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def _from_bits(typingctx, b):
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


_TWO23 = F32(8388608.0)
_TWO24 = F32(16777216.0)
_TWO_M24 = F32(2.0**-24)


@njit(cache=True, inline="always")
def _f16(x):
    """float32 x rounded to the nearest f16 (ties to even, overflow to inf), returned as float32:
    numpy's f32 -> f16 -> f32."""
    b = _bits(x)
    s = b & np.uint32(0x80000000)
    a = b & np.uint32(0x7FFFFFFF)
    if a >= np.uint32(0x7F800000):  # inf, nan
        return x
    if a >= np.uint32(0x38800000):  # f16 normal range: keep 10 mantissa bits
        a = (a + np.uint32(0xFFF) + ((a >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
        if a >= np.uint32(0x47800000):
            a = np.uint32(0x7F800000)
        return _from_bits(a | s)
    # f16 subnormal: multiples of 2^-24; |x| * 2^24 < 1024 is exact and (y + 2^23) - 2^23 rounds it
    # to an integer, ties to even
    y = _from_bits(a) * _TWO24
    r = (y + _TWO23) - _TWO23
    return _from_bits(_bits(r * _TWO_M24) | s)


@njit(cache=True, inline="always")
def _dot(q, qo, k, ko, hd, lanes):
    main = hd - hd % 64
    for t in range(64):
        lanes[t] = F32(0)
    for c in range(0, main, 64):
        for t in range(64):
            lanes[t] = F32(np.float64(q[qo + c + t]) * np.float64(k[ko + c + t]) + np.float64(lanes[t]))
    v = lanes  # folded in place: each step reads only entries it has not yet overwritten
    for t in range(16):
        v[t] = (lanes[t] + lanes[32 + t]) + (lanes[16 + t] + lanes[48 + t])
    for t in range(8):
        v[t] = v[8 + t] + v[t]
    for t in range(4):
        v[t] = v[4 + t] + v[t]
    total = (v[0] + v[2]) + (v[1] + v[3])
    if main == hd:
        return total
    sumf = np.float64(total)
    for i in range(main, hd):
        sumf = sumf + np.float64(q[qo + i]) * np.float64(k[ko + i])
    return F32(sumf)


@njit(cache=True)
def _attend(qh, kh, vh, visible, nkv, group, hd, scale, cap, out):
    """qh f32 [rows, nh*hd] (f16 values), kh/vh f32 [n, nkv*hd] (f16 values), visible bool [rows, n],
    scale/cap float32 (cap 0: no softcap; else scale is scale/cap), out f32 [rows, nh*hd]."""
    rows = qh.shape[0]
    n = kh.shape[0]
    nh = nkv * group
    lanes = np.empty(64, np.float32)
    acc = np.empty(hd, np.float32)
    one = F32(1)
    zero = F32(0)
    for r in range(rows):
        q = qh[r]
        for h in range(nh):
            qo = h * hd
            ko = (h // group) * hd
            m = F32(-np.inf)
            ssum = zero
            for i in range(hd):
                acc[i] = zero
            for j in range(n):
                if not visible[r, j]:
                    continue
                s = _dot(q, qo, kh[j], ko, hd, lanes) * scale
                if cap != zero:
                    s = cap * F32(math.tanh(s))
                if s > m:
                    ms = F32(math.exp(m - s))
                    vs = one
                    m = s
                    for i in range(hd):
                        acc[i] = _f16(F32(np.float64(acc[i]) * np.float64(ms)))
                else:
                    ms = one
                    vs = F32(math.exp(s - m))
                vrow = vh[j]
                vsd = np.float64(vs)
                for i in range(hd):
                    acc[i] = _f16(F32(np.float64(acc[i]) + np.float64(vrow[ko + i]) * vsd))
                ssum = F32(np.float64(ssum) * np.float64(ms) + vsd)
            inv = zero if ssum == zero else one / ssum
            for i in range(hd):
                out[r, qo + i] = acc[i] * inv


def attention_online(q: np.ndarray, keys: np.ndarray, vals: np.ndarray, visible: np.ndarray, a) -> np.ndarray:
    """`numerics.attention_online`, compiled for an f16 cache; the reference for any other."""
    if keys.dtype != np.float16 or numerics._LIBM is None:
        return numerics.attention_online(q, keys, vals, visible, a)
    rows = q.shape[0]
    nh, nkv, hd = a.n_head, a.n_kv_head, a.head_dim
    qh = np.ascontiguousarray(np.asarray(q, F32).astype(np.float16).astype(F32).reshape(rows, nh * hd))
    kh = np.ascontiguousarray(keys.astype(F32).reshape(-1, nkv * hd))
    vh = np.ascontiguousarray(vals.astype(F32).reshape(-1, nkv * hd))
    if a.softcap:
        scale, cap = (F32(a.scale) / F32(a.softcap)).astype(F32), F32(a.softcap)
    else:
        scale, cap = F32(a.scale), F32(0)
    out = np.empty((rows, nh * hd), F32)
    _attend(qh, kh, vh, np.ascontiguousarray(visible, dtype=np.bool_), nkv, nh // nkv, hd, scale, cap, out)
    return out


def warm_up() -> None:
    """Load (or compile, the first time) the compiled loop now rather than inside the first pass
    (~0.14 s from numba's on-disk cache)."""
    a = _WarmAttrs()
    one = np.ones((1, 64), F32)
    attention_online(one, one.astype(np.float16), one.astype(np.float16), np.ones((1, 1), bool), a)


class _WarmAttrs:
    n_head = n_kv_head = 1
    head_dim = 64
    scale = 1.0
    softcap = 0.0
