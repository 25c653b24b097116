"""Rotary scalings for the tests of every device's rope: each the attributes llama.cpp's setup gives
(kinetic/frontend/rope_scaling.py), so the kernels see the values real files produce.

plain: no scaling; linear: factor 4; yarn: factor 4 over an original context of 64 (the ramp
over pairs 0 to 9 with 64 rotated values and base 10000), attention factor as llama.cpp's context computes it;
llama3: rope_freqs factors 1 for high frequencies ramping to 8 for low ones; proportional: Gemma 4's
factors, 1 over the first half of the pairs and 1e30 beyond (cos 1, sin about 0 there); yarn_freqs:
YaRN and factors together.
"""

from __future__ import annotations

import numpy as np

from kinetic.frontend.rope_scaling import yarn_attn_factor
from kinetic.ir.ops import RopeAttrs


def llama3_factors(n_pairs: int, *, factor: float = 8.0, low: float = 1.0, high: float = 4.0,
                   orig_ctx: int = 64, theta: float = 10000.0) -> tuple[float, ...]:
    """Llama 3.1's conversion (convert_hf_to_gguf.py, LlamaModel): per pair, 1 where the wavelength is
    short, `factor` where it is long, a smooth ramp between, in float32."""
    freqs = 1.0 / theta ** (np.arange(0, 2 * n_pairs, 2, dtype=np.float64) / (2 * n_pairs))
    wavelen = 2 * np.pi / freqs
    low_wavelen, high_wavelen = orig_ctx / low, orig_ctx / high
    smooth = (orig_ctx / wavelen - low) / (high - low)
    out = np.where(wavelen < high_wavelen, 1.0,
                   np.where(wavelen > low_wavelen, factor, 1 / ((1 - smooth) / factor + smooth)))
    return tuple(float(v) for v in out.astype(np.float32))


def proportional_factors(n_pairs: int) -> tuple[float, ...]:
    return tuple(1.0 if i < n_pairs // 2 else 1e30 for i in range(n_pairs))


def scaled(a: RopeAttrs, scaling: str) -> RopeAttrs:
    """`a` with one of SCALINGS applied."""
    pairs = a.n_rot // 2
    yarn = dict(freq_scale=0.25, yarn_ext_factor=1.0, yarn_attn_factor=yarn_attn_factor(4.0), yarn_orig_ctx=64)
    extra = {
        "plain": {},
        "linear": dict(freq_scale=0.25),
        "yarn": yarn,
        "llama3": dict(freq_factors=llama3_factors(pairs, theta=a.theta)),
        "proportional": dict(freq_factors=proportional_factors(pairs)),
        "yarn_freqs": dict(yarn, freq_factors=llama3_factors(pairs, theta=a.theta)),
    }[scaling]
    return RopeAttrs(**{**a.__dict__, **extra})


SCALINGS = ("plain", "linear", "yarn", "llama3", "proportional", "yarn_freqs")
