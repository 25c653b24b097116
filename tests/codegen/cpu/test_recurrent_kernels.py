"""The CPU step's numba kernels for recurrent layers (kinetic/codegen/cpu/recurrent_kernels.py) give the
reference numerics' bits: the short convolution's taps and sigmoid here; the delta rule and the
Mamba-2 scan beside the transcriptions of ggml's loops (tests/frontend/test_recurrent_qwen35.py,
test_recurrent_mamba2.py)."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.codegen.cpu import recurrent_kernels
from kinetic.ir.numerics.recurrent import short_conv_row, sigmoid


@pytest.mark.parametrize("taps", [3, 4, 20, 27])  # fmas only; 16 rounded then 4 fmas; 16 and 8 rounded, 3 fmas
def test_the_conv_kernel_sums_the_taps_in_the_references_order(taps):
    """Each row's output equals numerics.short_conv_row of its window, bit for bit."""
    rng = np.random.default_rng(taps)
    windows = rng.standard_normal((5, taps, 33)).astype(np.float32)
    kernel = rng.standard_normal((33, taps)).astype(np.float32)
    want = np.stack([short_conv_row(w, kernel) for w in windows])
    assert np.array_equal(recurrent_kernels.short_conv_rows(windows, kernel).view(np.uint32), want.view(np.uint32))


def test_the_sigmoid_kernel_is_the_references():
    """sigmoid over random values, zeros of both signs, large values and infinities: the reference's bits."""
    x = (np.random.default_rng(0).standard_normal((7, 300)) * 8).astype(np.float32)
    x[0, :6] = [0.0, -0.0, 100.0, -100.0, np.inf, -np.inf]
    assert np.array_equal(recurrent_kernels.sigmoid(x).view(np.uint32), sigmoid(x).view(np.uint32))
