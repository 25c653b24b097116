"""Kernels of the types the CPU device trusts (target.BIT_EXACT) give numerics.matmul bit for bit,
whatever the row count, tile, thread count and variant, on random and real weights."""

from __future__ import annotations

import numpy as np
import pytest
from cpu_kernel_helpers import HOST_VARIANTS, assert_bits, random_weight
from gguf import GGMLQuantizationType as Q

from kinetic import hub
from kinetic.codegen.cpu.matmul import quantized_matmul
from kinetic.codegen.cpu.quant_blocks import LAYOUTS
from kinetic.codegen.cpu.target import BIT_EXACT
from kinetic.frontend.gguf_file import open_gguf
from kinetic.ir import numerics

# (N, K, M): K of one, several and an odd number of super-blocks; M below, at and above the tile
SHAPES = [(1, 256, 1), (37, 768, 5), (61, 512, 11), (16, 1280, 40)]
# (tile, threads) pairs every case runs under
SCHEDULES = [(1, 1), (4, 1), (3, 2), (8, 3)]
REAL = [
    ("blk.0.attn_output.weight", Q.Q4_K),
    ("blk.2.ffn_down.weight", Q.Q4_K),
    ("blk.0.ffn_down.weight", Q.Q6_K),
]


def reference(x: np.ndarray, raw: np.ndarray, wtype: Q) -> np.ndarray:
    return numerics.matmul(x, numerics.DequantizedWeight(raw, wtype))


def assert_all_schedules_equal_reference(x: np.ndarray, raw: np.ndarray, wtype: Q, jit) -> None:
    want = reference(x, raw, wtype)
    for variant in HOST_VARIANTS:
        for tile, threads in SCHEDULES:
            got = quantized_matmul(x, raw, wtype, jit=jit, variant=variant, tile=tile, threads=threads)
            assert_bits(got, want, f"{wtype.name} {variant} {tile=} {threads=}")


@pytest.mark.parametrize("wtype", sorted(BIT_EXACT), ids=lambda t: t.name)
@pytest.mark.parametrize("n,k,m", SHAPES)
def test_random_inputs_equal_reference_bit_for_bit(jit, wtype, n, k, m):
    """Random weights and activations: every variant, tile and thread count gives the reference's bits."""
    if k % LAYOUTS[wtype].block:
        pytest.skip("K is not a multiple of the block")
    rng = np.random.default_rng([n, k, m, int(wtype)])
    x = rng.standard_normal((m, k)).astype(np.float32)
    assert_all_schedules_equal_reference(x, random_weight(rng, wtype, n, k), wtype, jit)


@pytest.mark.parametrize("wtype", [Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
def test_integer_sums_beyond_float_precision(jit, wtype):
    """Largest quants and scales against equal activations: the int32 super-block sums exceed 2^24,
    so their conversion to float rounds, and it must round as the reference's does."""
    n, k = 4, 512
    blocks = np.full((n, k // 256, LAYOUTS[wtype].block_bytes), 0xFF, np.uint8)
    one = np.array([1.0], np.float16).view(np.uint8)
    if wtype is Q.Q4_K:  # d, dmin = 1; 6-bit scales and mins all 63; nibbles all 15
        blocks[:, :, 0:2] = blocks[:, :, 2:4] = one
    else:  # d = 1; quants all 63; scales 127 (rows 0, 1) or -128 (rows 2, 3)
        blocks[:, :, 208:210] = one
        blocks[:, :, 192:208] = np.uint8(127)
        blocks[2:, :, 192:208] = np.uint8(128)
    raw = blocks.reshape(n, -1)
    x = np.ones((3, k), np.float32)
    x[1] = -1.0
    x[2, ::2] = -1.0
    assert_all_schedules_equal_reference(x, raw, wtype, jit)


def _gemma():
    try:
        return open_gguf(hub.resolve_model("gemma3-270m"))
    except Exception as exc:  # a missing model skips, any other failure is the test's
        pytest.skip(f"gemma3-270m not available: {exc}")


@pytest.mark.parametrize("name,wtype", REAL, ids=[n for n, _ in REAL])
def test_gemma_tensors_equal_reference_bit_for_bit(jit, name, wtype):
    """A whole real Gemma-3 weight against 9 random rows: the reference's bits under every schedule,
    and each row computed alone gives the same bits as in the batch."""
    gguf = _gemma()
    assert gguf.tensors[name].type == wtype
    raw = np.array(gguf.array(name))
    raw = raw.reshape(raw.shape[0], -1)
    k = raw.shape[1] // LAYOUTS[wtype].block_bytes * LAYOUTS[wtype].block
    x = np.random.default_rng(k).standard_normal((9, k)).astype(np.float32)
    assert_all_schedules_equal_reference(x, raw, wtype, jit)
    want = reference(x, raw, wtype)
    for r in range(x.shape[0]):
        assert_bits(quantized_matmul(x[r : r + 1], raw, wtype, jit=jit), want[r : r + 1], f"row {r} alone")
