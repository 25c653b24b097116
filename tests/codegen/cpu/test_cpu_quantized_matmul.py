"""Generated quantized matmul kernels against numerics.matmul, and their exactness properties."""

from __future__ import annotations

import numpy as np
import pytest
from cpu_kernel_helpers import HOST_VARIANTS, assert_matches_reference, random_weight, variant_params
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.matmul import SUPPORTED, quantized_matmul, split_columns
from kinetic.codegen.cpu.quant_blocks import LAYOUTS

LEGACY = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]
K_QUANTS = [Q.Q4_K, Q.Q5_K, Q.Q6_K]

# (N, K, M): N not a multiple of anything, K a multiple of 32 but not of 256 for legacy types
LEGACY_SHAPES = [(1, 32, 1), (37, 96, 3), (600, 608, 1), (129, 576, 40)]
K_SHAPES = [(1, 256, 1), (37, 768, 5), (600, 512, 2), (53, 256, 40)]


def _case(wtype: Q, n: int, k: int, m: int, seed: int = 0):
    rng = np.random.default_rng([seed, n, k, m, int(wtype)])
    x = rng.standard_normal((m, k)).astype(np.float32)
    return x, random_weight(rng, wtype, n, k)


@pytest.mark.parametrize("wtype", LEGACY, ids=lambda t: t.name)
@pytest.mark.parametrize("n,k,m", LEGACY_SHAPES)
def test_legacy_types_match_reference(jit, wtype, n, k, m):
    """Each output equals numerics.matmul within 1e-5 of the sum of its |products|."""
    x, w = _case(wtype, n, k, m)
    assert_matches_reference(quantized_matmul(x, w, wtype, jit=jit), x, w, wtype)


@pytest.mark.parametrize("wtype", K_QUANTS, ids=lambda t: t.name)
@pytest.mark.parametrize("n,k,m", K_SHAPES)
def test_k_quants_match_reference(jit, wtype, n, k, m):
    """Each output equals numerics.matmul within 1e-5 of the sum of its |products|."""
    x, w = _case(wtype, n, k, m)
    assert_matches_reference(quantized_matmul(x, w, wtype, jit=jit), x, w, wtype)


@pytest.mark.parametrize("wtype", sorted(SUPPORTED), ids=lambda t: t.name)
def test_batch_invariance(jit, wtype):
    """Row r of a 37-row call is bit for bit the 1-row call on row r alone."""
    k = 512
    x, w = _case(wtype, 45, k, 37, seed=1)
    batch = quantized_matmul(x, w, wtype, jit=jit)
    for r in range(x.shape[0]):
        alone = quantized_matmul(x[r : r + 1], w, wtype, jit=jit)
        np.testing.assert_array_equal(batch[r : r + 1].view(np.uint32), alone.view(np.uint32), err_msg=f"row {r}")


@pytest.mark.parametrize("wtype", [Q.Q4_1, Q.Q5_0, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
def test_tile_and_thread_invariance(jit, wtype):
    """Row tiles of 1, 3 and 8 and 1, 2 or 3 threads give bit-identical results."""
    x, w = _case(wtype, 61, 512, 11, seed=2)
    base = quantized_matmul(x, w, wtype, jit=jit, tile=1)
    for tile, threads in [(3, 1), (8, 1), (4, 2), (1, 3)]:
        got = quantized_matmul(x, w, wtype, jit=jit, tile=tile, threads=threads)
        np.testing.assert_array_equal(got.view(np.uint32), base.view(np.uint32), err_msg=f"{tile=} {threads=}")


@pytest.mark.parametrize("wtype", [Q.Q4_1, Q.Q5_0, Q.Q8_0], ids=lambda t: t.name)
def test_leftover_rows_over_several_column_chunks(jit, wtype):
    """Rows below a tile walk ~128 KB column chunks (rows reuse a chunk from L2), a row alone all its
    columns in one sweep: both give the same bits, on odd column ranges split over threads."""
    x, w = _case(wtype, 1001, 2048, 3, seed=4)  # ~1.3-2.2 KB per weight row: several chunks
    alone = np.concatenate([quantized_matmul(x[r : r + 1], w, wtype, jit=jit) for r in range(3)])
    for threads in (1, 2, 3):
        got = quantized_matmul(x, w, wtype, jit=jit, threads=threads)
        np.testing.assert_array_equal(got.view(np.uint32), alone.view(np.uint32), err_msg=f"{threads=}")
    assert_matches_reference(alone, x, w, wtype)


@pytest.mark.parametrize("variant", variant_params)
@pytest.mark.parametrize("wtype", sorted(SUPPORTED), ids=lambda t: t.name)
def test_variants_are_bit_identical(jit, wtype, variant):
    """Every variant the host runs gives the generic (plain LLVM vector) kernel's bits."""
    k = 768 if LAYOUTS[wtype].block == 256 else 608
    x, w = _case(wtype, 23, k, 6, seed=3)
    generic = quantized_matmul(x, w, wtype, jit=jit, variant="generic")
    got = quantized_matmul(x, w, wtype, jit=jit, variant=variant)
    np.testing.assert_array_equal(got.view(np.uint32), generic.view(np.uint32))


def test_extreme_weights_do_not_saturate(jit):
    """Q8_0 weights of -128 and 127 against activations of +-127: AVX2's 16-bit pair sums never clip."""
    k = 64
    w = np.zeros((2, k // 32 * 34), np.uint8).reshape(2, -1, 34)
    w[:, :, 0:2] = np.array([1.0], np.float16).view(np.uint8)
    w[0, :, 2:] = np.uint8(128)  # int8 -128
    w[1, :, 2:] = np.uint8(127)
    w = w.reshape(2, -1)
    x = np.where(np.arange(k) % 2 == 0, 1.0, -1.0).astype(np.float32)[None, :].repeat(2, 0)
    x[1] = 1.0
    for variant in HOST_VARIANTS:
        assert_matches_reference(quantized_matmul(x, w, Q.Q8_0, jit=jit, variant=variant), x, w, Q.Q8_0)


def test_split_columns_covers_each_column_once():
    """Thread ranges tile [0, n) in order with no gaps or overlaps, for n below and above the thread count."""
    for n in (1, 2, 7, 600):
        for threads in (1, 2, 3):
            ranges = split_columns(n, threads)
            assert [c for a, b in ranges for c in range(a, b)] == list(range(n))


def test_rejects_a_weight_of_the_wrong_width(jit):
    """A weight whose row bytes do not match K is refused, not read out of bounds."""
    x = np.zeros((1, 64), np.float32)
    with pytest.raises(ValueError):
        quantized_matmul(x, np.zeros((4, 34), np.uint8), Q.Q8_0, jit=jit)


@pytest.mark.parametrize("wtype", sorted(SUPPORTED), ids=lambda t: t.name)
def test_few_rows_share_blocks_without_changing_a_bit(jit, wtype):
    """Passes of 2..7 rows (a verification pass, a prompt's last chunk, a Convoy pass) run 4-row tiles,
    or the column quads' row groups of 4, 3 and 2 (IQ4_NL, MXFP4, Q4_0), before single rows; every row
    is still bit for bit the row alone."""
    x, w = _case(wtype, 24, 512, 7, seed=5)
    alone = np.concatenate([quantized_matmul(x[r : r + 1], w, wtype, jit=jit) for r in range(7)])
    for m in range(2, 8):
        got = quantized_matmul(x[:m], w, wtype, jit=jit)
        np.testing.assert_array_equal(got.view(np.uint32), alone[:m].view(np.uint32), err_msg=f"{m} rows")
