"""The generated activation quantizers give numerics.py's Q8_0 / Q8_1 / Q8_K blocks bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.codegen.cpu.matmul import quantize_activations
from kinetic.ir import numerics


def awkward_rows(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    """Rows with wide scales, an all-zero block, exact .5 ties after scaling and +-max magnitude ties."""
    x = (rng.standard_normal((m, k)) * np.exp(rng.uniform(-8, 8, (m, 1)))).astype(np.float32)
    x[0, :32] = 0.0
    if k >= 512:
        x[-1, 256:512] = 0.0
    x[m // 2, 32:64] = np.arange(-16, 16, dtype=np.float32) * 0.5  # scaled values land on halves
    x[-1, 64] = 100.0  # the same magnitude with both signs: the first one wins in Q8_K
    x[-1, 65] = -100.0
    x[-1, 0] = -100.0
    return x


@pytest.mark.parametrize("m,k", [(1, 256), (3, 512), (17, 1536)])
def test_q8_0_matches_reference(jit, m, k):
    """q and the f16-rounded d equal numerics.quantize_q8_0 exactly."""
    x = awkward_rows(np.random.default_rng(k + m), m, k)
    got = quantize_activations(x, "q8_0", jit)
    q, d = numerics.quantize_q8_0(x)
    np.testing.assert_array_equal(got.q, q.reshape(m, k))
    np.testing.assert_array_equal(got.d.view(np.uint32), d.view(np.uint32))


@pytest.mark.parametrize("m,k", [(1, 256), (5, 608)])
def test_q8_1_sums_match_reference(jit, m, k):
    """Q8_1 has Q8_0's q and d, and s equals numerics.q8_1_sums exactly."""
    x = awkward_rows(np.random.default_rng(k + m), m, k)
    got = quantize_activations(x, "q8_1", jit)
    q, d = numerics.quantize_q8_0(x)
    np.testing.assert_array_equal(got.q, q.reshape(m, k))
    np.testing.assert_array_equal(got.d, d)
    np.testing.assert_array_equal(got.extra.view(np.uint32), numerics.q8_1_sums(x).view(np.uint32))


@pytest.mark.parametrize("m,k", [(1, 256), (4, 768), (9, 2048)])
def test_q8_k_matches_reference(jit, m, k):
    """q, d (= 1/iscale, 0 for a zero block) and the sums of each 16 q equal numerics.quantize_q8_k."""
    x = awkward_rows(np.random.default_rng(k + m), m, k)
    got = quantize_activations(x, "q8_k", jit)
    q, d = numerics.quantize_q8_k(x)
    np.testing.assert_array_equal(got.q, q.reshape(m, k))
    np.testing.assert_array_equal(got.d.view(np.uint32), d.view(np.uint32))
    np.testing.assert_array_equal(got.extra, q.reshape(m, -1, 16).astype(np.int32).sum(axis=2))


def test_q8_k_first_largest_magnitude_sets_the_sign(jit):
    """With +a and -a both of largest magnitude, the first decides the scale's sign (q of it is -127)."""
    x = np.zeros((1, 256), np.float32)
    x[0, 3], x[0, 200] = 2.0, -2.0
    got = quantize_activations(x, "q8_k", jit)
    assert got.q[0, 3] == -127 and got.q[0, 200] == 127
    assert got.d[0, 0] < 0
