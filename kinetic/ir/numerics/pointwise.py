"""Row-local ops as ggml's CPU computes them: RMS norm, rotary, GELU, SiLU (with ggml's vectorized
exp) and soft-capping.

Owns: rms_norm (squares summed in float64, scaled in float32); rotary angles and their cos/sin
(theta_scale = powf(base, -2/n_rot) and cosf/sinf from the C library, angles advanced by float32
products) and the rotation, contracted to fma(x0, cos, -(x1*sin)) / fma(x0, sin, x1*cos); GELU from
ggml's f16 table built with tanhf, x <= -10 -> 0 and x >= 10 -> x; SiLU as x / (1 + ggml_v_expf(-x));
softcap as cap * tanhf(x / cap).
"""

from __future__ import annotations

import numpy as np

from kinetic.ir.numerics.floats import F32, fma_f32, libm_f32, powf


def rms_norm(x: np.ndarray, eps: float, group: int = 0) -> np.ndarray:
    rows, width = x.shape
    g = group or width
    xg = x.reshape(rows, width // g, g).astype(np.float32)
    mean = (np.square(xg).astype(np.float64).sum(axis=2) / g).astype(np.float32)
    scale = (np.float32(1) / np.sqrt(mean + np.float32(eps))).astype(np.float32)
    return (xg * scale[:, :, None]).reshape(rows, width)


_ROPE_CACHE: dict[tuple, dict[int, tuple[np.ndarray, np.ndarray]]] = {}


def rope_angles(positions: np.ndarray, n_rot: int, theta: float, freq_scale: float) -> np.ndarray:
    """f32 [rows, n_rot/2] angles as ggml's rope cache builds them (ops.cpp, ggml_rope_cache_init):
    theta_scale = powf(base, -2/n_rot) from the C library, the angle starts at the position (f32)
    and is multiplied by theta_scale in float32 for each pair, then by freq_scale."""
    step = powf(theta, F32(-2.0) / F32(n_rot))
    out = np.empty((len(positions), n_rot // 2), F32)
    cur = np.asarray(positions).astype(F32)
    for i in range(n_rot // 2):
        out[:, i] = F32(freq_scale) * cur
        cur = (cur * step).astype(F32)
    return out


def rope_cos_sin(positions: np.ndarray, n_rot: int, theta: float, freq_scale: float,
                 mscale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin f32 [rows, n_rot/2] of the rope angles, by the C library's cosf/sinf (ggml's
    rope_yarn without the YaRN ramp), times mscale; cached per position."""
    cache = _ROPE_CACHE.setdefault((float(theta), int(n_rot), float(freq_scale), float(mscale)), {})
    missing = sorted({int(p) for p in positions} - cache.keys())
    if missing:
        ang = rope_angles(np.array(missing), n_rot, theta, freq_scale)
        cos = (libm_f32("cosf", ang) * F32(mscale)).astype(F32)
        sin = (libm_f32("sinf", ang) * F32(mscale)).astype(F32)
        for i, p in enumerate(missing):
            cache[p] = (cos[i], sin[i])
    cos = np.stack([cache[int(p)][0] for p in positions]) if len(positions) else np.zeros((0, n_rot // 2), F32)
    sin = np.stack([cache[int(p)][1] for p in positions]) if len(positions) else np.zeros((0, n_rot // 2), F32)
    return cos, sin


def rope_rotate(x0: np.ndarray, x1: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One rotary pair as ggml's rotate_pairs computes it once the compiler has contracted it
    (GCC, -march with FMA): y0 = fma(x0, cos, -(x1*sin)), y1 = fma(x0, sin, x1*cos)."""
    y0 = fma_f32(x0, cos, -(x1 * sin).astype(F32))
    y1 = fma_f32(x0, sin, (x1 * cos).astype(F32))
    return y0, y1


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
