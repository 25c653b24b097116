"""Row-local ops as ggml's CPU computes them: RMS norm, GELU, SiLU (with ggml's vectorized exp) and
soft-capping (rotary is rotary.py's).

Owns: rms_norm (squares summed in float64, scaled in float32); GELU from
ggml's f16 table built with tanhf, x <= -10 -> 0 and x >= 10 -> x; SiLU as x / (1 + ggml_v_expf(-x));
softcap as cap * tanhf(x / cap).
"""

from __future__ import annotations

import numpy as np

from kinetic.ir.numerics.floats import F32, fma_f32, libm_f32


def rms_norm(x: np.ndarray, eps: float, group: int = 0) -> np.ndarray:
    rows, width = x.shape
    g = group or width
    xg = x.reshape(rows, width // g, g).astype(np.float32)
    mean = (np.square(xg).astype(np.float64).sum(axis=2) / g).astype(np.float32)
    scale = (np.float32(1) / np.sqrt(mean + np.float32(eps))).astype(np.float32)
    return (xg * scale[:, :, None]).reshape(rows, width)


_GELU_TABLE: list[np.ndarray] = []

SQRT_2_OVER_PI = F32(0.79788456080286535587989211986876)
GELU_COEF_A = F32(0.044715)


def gelu_table() -> np.ndarray:
    """ggml's GELU table (ggml-cpu.c, ggml_cpu_init; vec.h, ggml_gelu_f32): for every f16 value x,
    f16(0.5x * (1 + tanhf(S x * (1 + A x x)))) in float32 with the C library's tanhf, where the
    compiler contracts 1 + (A x) x into one fma. Indexed by the f16 bit pattern."""
    if not _GELU_TABLE:
        x = np.arange(65536, dtype=np.uint16).view(np.float16).astype(F32)
        with np.errstate(all="ignore"):
            inner = ((SQRT_2_OVER_PI * x) * fma_f32(GELU_COEF_A * x, x, F32(1))).astype(F32)
            t = libm_f32("tanhf", np.nan_to_num(inner))
            y = ((F32(0.5) * x) * (F32(1) + t)).astype(np.float16)
        _GELU_TABLE.append(y)
    return _GELU_TABLE[0]


def gelu_ggml(x: np.ndarray) -> np.ndarray:
    """GELU (tanh form) as ggml's CPU evaluates it (vec.h, ggml_vec_gelu_f32 / ggml_vec_geglu_f32 with
    GGML_GELU_FP16): x <= -10 -> 0, x >= 10 -> x, otherwise the table entry of f16(x)."""
    x = np.asarray(x, F32)
    y = gelu_table()[x.astype(np.float16).view(np.uint16)].astype(F32)
    y = np.where(x <= -10, F32(0), y)
    return np.where(x >= 10, x, y).astype(F32)


def expf_ggml(x: np.ndarray) -> np.ndarray:
    """ggml_v_expf, the vectorized exp of ggml's SiLU (vec.h, AVX-512 variant): a degree-5
    polynomial on the reduced argument with fmas, scaled by 2^n; |n| > 192 saturates to 0 or inf."""
    x = np.asarray(x, F32)
    with np.errstate(all="ignore"):
        r = F32(float.fromhex("0x1.8p23"))
        z = fma_f32(x, F32(float.fromhex("0x1.715476p+0")), r)
        n = (z - r).astype(F32)
        b = fma_f32(-n, F32(float.fromhex("0x1.7f7d1cp-20")), fma_f32(-n, F32(float.fromhex("0x1.62e4p-1")), x))
        u = (b * b).astype(F32)
        c5, c4 = F32(float.fromhex("0x1.0e4020p-7")), F32(float.fromhex("0x1.573e2ep-5"))
        c3, c2 = F32(float.fromhex("0x1.555e66p-3")), F32(float.fromhex("0x1.fffdb6p-2"))
        c1 = F32(float.fromhex("0x1.ffffecp-1"))
        j = fma_f32(fma_f32(fma_f32(c5, b, c4), u, fma_f32(c3, b, c2)), u, fma_f32(c1, b, F32(1)))
        res = np.ldexp(j, np.clip(n, -300, 300).astype(np.int32)).astype(F32)
        big = np.abs(n) > 192
        return np.where(big, np.where(n <= 0, F32(0), F32(np.inf)), res).astype(F32)


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanhf(x * (1/cap)): ggml's scale, tanh (C library tanhf), scale sequence."""
    inv = (F32(1) / F32(cap)).astype(F32)
    return (F32(cap) * libm_f32("tanhf", (np.asarray(x, F32) * inv).astype(F32))).astype(F32)


def silu(x: np.ndarray) -> np.ndarray:
    """x / (1 + ggml_v_expf(-x)) in float32 (vec.h, ggml_v_silu)."""
    x = np.asarray(x, F32)
    with np.errstate(all="ignore"):
        return (x / (F32(1) + expf_ggml((F32(0) - x).astype(F32)))).astype(F32)
