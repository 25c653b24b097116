"""Rows of float32 values that reach every branch of ggml's reference quantizers, for
test_encoders.py and record_blocks.py: ordinary weights, heavy outliers, zero and constant rows and
sub-blocks, values below GROUP_MAX_EPS, all-positive and all-negative rows (the min clamp of the
K-quants' searches), values on a coarse grid (rounding ties) and a mix of these per 16 values.

Owns the cases only (a fixed seed: the recorded hashes depend on every value).
"""

from __future__ import annotations

import numpy as np

NCOLS = 512  # two super-blocks of 256 per row: every type's blocks fit
ROWS = 24
SEED = 27


def block_cases() -> dict[str, np.ndarray]:
    """name -> f32 [ROWS, NCOLS]."""
    rng = np.random.default_rng(SEED)
    shape = (ROWS, NCOLS)
    normal = rng.standard_normal(shape) * 0.02
    heavy = normal * np.where(rng.random(shape) < 0.01, 200.0, 1.0)
    zeros = normal * (rng.random((ROWS, NCOLS // 16, 1)) < 0.5).repeat(16, axis=2).reshape(shape)
    zeros[:4] = 0.0
    constant = np.repeat(rng.standard_normal((ROWS, 1)), NCOLS, axis=1)
    tiny = normal * 1e-16
    positive = np.abs(normal) + 0.01
    negative = -positive
    grid = np.round(rng.standard_normal(shape) * 8) / 8
    cases = {"normal": normal, "heavy": heavy, "zeros": zeros, "constant": constant, "tiny": tiny,
             "positive": positive, "negative": negative, "grid": grid}
    picks = rng.integers(0, len(cases), size=(ROWS, NCOLS // 16)).repeat(16, axis=1)
    stack = np.stack(list(cases.values()))
    cases["mixed"] = np.take_along_axis(stack, picks[None], axis=0)[0]
    return {name: np.ascontiguousarray(values, dtype=np.float32) for name, values in cases.items()}
