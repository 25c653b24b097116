"""The quantized matmul kernels of Q6_K, Q5_K, Q3_K and IQ4_XS in the fast order "block_chain" (issue
23) against numerics.matmul(..., order="block_chain"), bit for bit, on every path: 16-row lane tiles
(matmul_k_chain_ir on VNNI), tiles of 8, 4, 2 rows, rows alone (decode: matmul_k_columns_ir); and their
ggml-order kernels untouched by it."""

from __future__ import annotations

import numpy as np
import pytest
from cpu_kernel_helpers import HOST_VARIANTS, assert_bits, chain_case, chain_reference, random_weight, variant_params
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.matmul import quantized_matmul
from kinetic.codegen.cpu.matmul_ir import render_matmul
from kinetic.codegen.cpu.target import host, kernel_orders

KQUANTS = [Q.Q6_K, Q.Q5_K, Q.Q3_K, Q.IQ4_XS]
ROWS = (1, 2, 3, 15, 16, 17, 33, 40)  # decode, small tiles, a tile of 16 and past it, two and past
BEST = host().best_variant()
names = [t.name for t in KQUANTS]


@pytest.mark.parametrize("variant", variant_params)
@pytest.mark.parametrize("wtype", KQUANTS, ids=names)
def test_every_row_count_equals_the_reference_bit_for_bit(jit, wtype, variant):
    """For K in 256 .. 2048 (the host's best variant; 256 and 768 on the others) and M rows in 1 .. 40,
    every output is the reference's block_chain value, bit for bit."""
    ks = (256, 768, 2048) if variant == BEST else (256, 768)
    for k in ks:
        x, w = chain_case(wtype, 37, k, max(ROWS))
        want = chain_reference(x, w, wtype)
        for m in ROWS:
            got = quantized_matmul(x[:m], w, wtype, jit=jit, variant=variant, order="block_chain")
            assert_bits(got, want[:m], f"{variant} K={k} M={m}")


@pytest.mark.parametrize("wtype", KQUANTS, ids=names)
def test_a_prompt_of_512_rows_over_threads_equals_the_reference(jit, wtype):
    """512 rows (32 lane tiles) of a weight with an odd column count, split over 1, 2 and 3 threads,
    give the reference's bits: the threads' column ranges and the chunks never change a value."""
    x, w = chain_case(wtype, 67, 512, 512, seed=1)
    want = chain_reference(x, w, wtype)
    for threads in (1, 2, 3):
        assert_bits(quantized_matmul(x, w, wtype, jit=jit, threads=threads, order="block_chain"), want,
                     f"{threads} threads")


@pytest.mark.parametrize("wtype", KQUANTS, ids=names)
def test_decode_over_threads_equals_the_reference(jit, wtype):
    """One and three rows alone (decode: matmul_k_columns_ir's column groups) over 1 .. 5 threads, whose
    column ranges start and end inside a group of columns, give the reference's bits."""
    x, w = chain_case(wtype, 37, 512, 3, seed=5)
    want = chain_reference(x, w, wtype)
    for m in (1, 3):
        for threads in (1, 2, 3, 5):
            got = quantized_matmul(x[:m], w, wtype, jit=jit, threads=threads, order="block_chain")
            assert_bits(got, want[:m], f"M={m}, {threads} threads")


@pytest.mark.parametrize("wtype", [Q.Q6_K, Q.Q5_K], ids=["Q6_K", "Q5_K"])
def test_a_long_row_equals_the_reference(jit, wtype):
    """K = 8192 (32 super-blocks in one chain: the FFN widths of larger models), 17 rows."""
    x, w = chain_case(wtype, 9, 8192, 17, seed=2)
    assert_bits(quantized_matmul(x, w, wtype, jit=jit, order="block_chain"), chain_reference(x, w, wtype), "K=8192")


@pytest.mark.parametrize("wtype", KQUANTS, ids=names)
def test_tiles_and_the_narrow_path_give_the_same_bits(jit, wtype):
    """Tiles of 1, 4, 8 and 16 rows, with and without the 16-row lane tiles, give the same bits for
    every row: the tile is a speed choice (kinetic compile --tune) and never a value."""
    x, w = chain_case(wtype, 45, 768, 37, seed=3)
    base = quantized_matmul(x, w, wtype, jit=jit, tile=1, order="block_chain")
    for tile in (4, 8, 16):
        for wide in (True, False):
            got = quantized_matmul(x, w, wtype, jit=jit, tile=tile, wide=wide, order="block_chain")
            assert_bits(got, base, f"tile {tile} wide {wide}")


def test_extreme_blocks_equal_the_reference_in_every_variant(jit):
    """Super-blocks with every quant and scale byte 0x00 or 0xFF (the largest weights and scales each
    type encodes, of either sign) against activations of +-127: no variant's integer sums clip."""
    k = 512
    x = np.where(np.arange(k) % 2 == 0, 1.0, -1.0).astype(np.float32)[None, :].repeat(17, 0)
    x[1::2] = 1.0
    x[2] = -1.0
    d_at = {Q.Q6_K: (208,), Q.Q5_K: (0, 2), Q.Q3_K: (108,), Q.IQ4_XS: (0,)}
    for wtype in KQUANTS:
        w = random_weight(np.random.default_rng(4), wtype, 8, k)
        blocks = w.reshape(8, k // 256, -1)
        keep = blocks.copy()
        for n in range(8):
            blocks[n] = 0xFF if n % 2 else 0x00
            for at in d_at[wtype]:  # finite f16 scales
                blocks[n, :, at : at + 2] = keep[n, :, at : at + 2]
        for variant in HOST_VARIANTS:
            got = quantized_matmul(x, w, wtype, jit=jit, variant=variant, order="block_chain")
            assert_bits(got, chain_reference(x, w, wtype), f"{wtype.name} {variant}")


@pytest.mark.parametrize("wtype", KQUANTS, ids=names)
def test_the_chain_is_a_kernel_of_its_own(wtype):
    """The CPU declares block_chain for these types, renders it under its own name, and the ggml
    order by name is the default kernel."""
    assert kernel_orders(wtype) == {"lanes8", "block_chain"}
    default = render_matmul(wtype, 512, "vnni", 8)
    assert render_matmul(wtype, 512, "vnni", 8, order="lanes8") == default
    assert render_matmul(wtype, 512, "vnni", 8, order="block_chain")[1] != default[1]


@pytest.mark.parametrize("wtype", KQUANTS, ids=names)
def test_a_row_gives_the_same_bits_alone_as_in_a_prompt(jit, wtype):
    """Batch invariance: each of 40 rows computed alone (the decode path) equals its row of the
    40-row pass (lane tiles, then smaller tiles)."""
    x, w = chain_case(wtype, 21, 1024, 40, seed=5)
    batch = quantized_matmul(x, w, wtype, jit=jit, order="block_chain")
    for r in (0, 7, 16, 31, 39):
        assert_bits(quantized_matmul(x[r : r + 1], w, wtype, jit=jit, order="block_chain"), batch[r : r + 1],
                     f"row {r}")
