"""Rotary position embedding as ggml's CPU computes it (ggml-cpu/ops.cpp: ggml_rope_cache_init,
rope_yarn, rope_yarn_ramp; ggml.c: ggml_rope_yarn_corr_dims), with every scaling llama.cpp applies.

Owns: `Rotary`, the parameters that fix a rotary table's values (what ggml_rope_ext takes besides
the layout: dimensions, base, linear scale, the YaRN ramp and attention factor, the frequency
factors of a `rope_freqs` tensor), and their arithmetic: the angles of each pair, YaRN's correction
dimensions and ramp, the magnitude `mscale`, cos and sin (the C library's cosf / sinf) and the
rotation. Does not own where the parameters come from (kinetic/frontend/hparams.py: the file's keys
and llama.cpp's context defaults) nor the layout of the rotated values (reference.rope).

ggml per pair i (i0 = 2i) of a row at position p, all in float32:
    theta_extrap = p * theta_scale^i / freq_factors[i]     (theta_scale = powf(base, -2/n_rot), the
                                                            power advanced by float32 products)
    theta_interp = freq_scale * theta_extrap
    theta        = theta_interp                            without YaRN (ext_factor 0), else
                 = theta_interp * (1 - mix) + theta_extrap * mix,   mix = ramp(i) * ext_factor
    mscale       = attn_factor [* (1 + 0.1 * logf(1 / freq_scale)) with YaRN]
    cos, sin     = cosf(theta) * mscale, sinf(theta) * mscale
ggml-cpu is built with -march=native, so the compiler contracts `a * b + c` into one fma where the
source has it (the mix, mscale, the rotation); the test against llama.cpp's own library
(tests/ir/test_rotary.py) pins which product it fuses. A freq factor of 1e30 (Gemma 4's
"proportional" rotary beyond its rotated dims) gives an angle near 0: cos 1 and sin about 1e-27.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from kinetic.ir.numerics.floats import F32, fma_f32, libm_f32, logf, powf


class Rotary(NamedTuple):
    """Everything that fixes the cos/sin table of a rotary node, hashable (a device keeps one table
    per distinct value). Defaults are no scaling: a plain table."""

    n_rot: int
    theta: float
    freq_scale: float = 1.0
    ext_factor: float = 0.0  # YaRN's extrapolation mix (0: off)
    attn_factor: float = 1.0  # the magnitude ggml multiplies cos and sin by (before YaRN's own)
    orig_ctx: int = 0  # YaRN: the context the model was trained at (its correction dimensions)
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    freq_factors: tuple[float, ...] = ()  # per pair, dividing its angle (a rope_freqs tensor); () = none

    @property
    def plain(self) -> bool:
        """No YaRN, no frequency factors, magnitude 1: angles are freq_scale * p * theta_scale^i."""
        return not self.ext_factor and not self.freq_factors and self.attn_factor == 1.0


def yarn_corr_dims(r: Rotary) -> tuple[np.float32, np.float32]:
    """ggml_rope_yarn_corr_dims: the pairs from which YaRN interpolates (low) and below which it
    extrapolates (high), floorf / ceilf of n_dims * logf(orig_ctx / (beta * 2 * pi)) / (2 * logf(base)),
    clamped to [0, n_rot - 1]."""
    def corr_dim(beta: float) -> np.float32:
        ratio = F32(r.orig_ctx) / ((F32(beta) * F32(2)) * F32(math.pi))
        return F32(F32(r.n_rot) * logf(ratio)) / (F32(2) * logf(r.theta))

    start, end = F32(math.floor(corr_dim(r.beta_fast))), F32(math.ceil(corr_dim(r.beta_slow)))
    return max(F32(0), start), min(F32(r.n_rot - 1), end)


def yarn_mix(r: Rotary) -> np.ndarray:
    """f32 [n_rot/2]: rope_yarn_ramp(low, high, i0) * ext_factor per pair, where the ramp is
    1 - clamp((i0/2 - low) / max(0.001, high - low), 0, 1)."""
    low, high = yarn_corr_dims(r)
    y = ((np.arange(r.n_rot // 2).astype(F32) - low) / max(F32(0.001), F32(high - low))).astype(F32)
    ramp = (F32(1) - np.minimum(F32(1), np.maximum(F32(0), y))).astype(F32)
    return (ramp * F32(r.ext_factor)).astype(F32)


def rope_mscale(r: Rotary) -> np.float32:
    """attn_factor, times fma(0.1, logf(1 / freq_scale), 1) when YaRN is on (rope_yarn)."""
    if not r.ext_factor:
        return F32(r.attn_factor)
    inv = F32(F32(1) / F32(r.freq_scale))
    return F32(F32(r.attn_factor) * fma_f32(F32(0.1), logf(inv), F32(1)))


def rope_angles(positions: np.ndarray, r: Rotary) -> np.ndarray:
    """f32 [rows, n_rot/2] angles as ggml_rope_cache_init makes them: the position (f32) multiplied
    by theta_scale in float32 for each pair, divided by the pair's freq factor, then scaled (and with
    YaRN mixed with the unscaled angle by the ramp)."""
    step = powf(r.theta, F32(-2.0) / F32(r.n_rot))
    factors = np.asarray(r.freq_factors, F32) if r.freq_factors else None
    mix = yarn_mix(r) if r.ext_factor else None
    scale = F32(r.freq_scale)
    out = np.empty((len(positions), r.n_rot // 2), F32)
    cur = np.asarray(positions).astype(F32)
    with np.errstate(over="ignore", under="ignore"):
        for i in range(r.n_rot // 2):
            extrap = cur if factors is None else (cur / factors[i]).astype(F32)
            interp = (scale * extrap).astype(F32)
            if mix is None:
                out[:, i] = interp
            else:  # interp * (1 - mix) + extrap * mix, the first product fused
                out[:, i] = fma_f32(interp, F32(1) - mix[i], (extrap * mix[i]).astype(F32))
            cur = (cur * step).astype(F32)
    return out


_ROPE_CACHE: dict[Rotary, dict[int, tuple[np.ndarray, np.ndarray]]] = {}


def rope_cos_sin(positions: np.ndarray, r: Rotary) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin f32 [rows, n_rot/2] of the angles, by the C library's cosf/sinf, times mscale
    (rope_yarn); cached per position."""
    cache = _ROPE_CACHE.setdefault(r, {})
    missing = sorted({int(p) for p in positions} - cache.keys())
    if missing:
        ang = rope_angles(np.array(missing), r)
        mscale = rope_mscale(r)
        cos = (libm_f32("cosf", ang) * mscale).astype(F32)
        sin = (libm_f32("sinf", ang) * mscale).astype(F32)
        for i, p in enumerate(missing):
            cache[p] = (cos[i], sin[i])
    if not len(positions):
        empty = np.zeros((0, r.n_rot // 2), F32)
        return empty, empty
    return (np.stack([cache[int(p)][0] for p in positions]), np.stack([cache[int(p)][1] for p in positions]))


def rope_rotate(x0: np.ndarray, x1: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One rotary pair as ggml's rotate_pairs computes it once the compiler has contracted it
    (GCC, -march with FMA): y0 = fma(x0, cos, -(x1*sin)), y1 = fma(x0, sin, x1*cos)."""
    y0 = fma_f32(x0, cos, -(x1 * sin).astype(F32))
    y1 = fma_f32(x0, sin, (x1 * cos).astype(F32))
    return y0, y1
