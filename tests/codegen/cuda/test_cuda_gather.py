"""The gather kernels (Q8_0 embedding lookup, row selection, KV cache store) on the host emulation,
in both thread orders, against the reference: quants.dequantize_rows (the interpreter's embed), numpy
indexing (its take_rows) and numpy's astype(float16) (the cache's rounding), bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_helpers import (
    EMBED_WIDTHS,
    KV_STORE_WIDTHS,
    TAKE_ROWS_WIDTHS,
    f16_rounding_cases,
    kernel_embed,
    kernel_kv_store,
    kernel_take_rows,
    random_q8_0_table,
)
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cuda import emulator
from kinetic.ir.quants import dequantize_rows
from tests.device_checks import same_bits

N_VOCAB = 50
SENTINEL = 0xABCD  # f16 bits a cache slot holds before a store


@pytest.fixture(params=["host", "host_forward"])
def prog(request) -> emulator.HostProgram:
    """The emulation in one thread order, then the other."""
    return request.getfixturevalue(request.param)


@pytest.mark.parametrize("width", EMBED_WIDTHS)
def test_embed_equals_dequantize_rows(prog, width):
    """embed_q8_0 gives dequantize_rows' values bit for bit for tokens anywhere in the table (first,
    last, repeated, out of order), with random f16 scales of every magnitude and real-looking ones."""
    rng = np.random.default_rng(40)
    table = random_q8_0_table(rng, N_VOCAB, width)
    tokens = np.array([0, N_VOCAB - 1, 7, 7, 3, *rng.integers(0, N_VOCAB, 6)], np.int32)
    got = kernel_embed(prog, np, table, tokens)
    assert same_bits(got, dequantize_rows(table, Q.Q8_0, tokens).reshape(len(tokens), -1))


@pytest.mark.parametrize("width", TAKE_ROWS_WIDTHS)
def test_take_rows_copies_the_indexed_rows(prog, width):
    """take_rows gives x[index] bit for bit (NaN payloads, signed zeros and subnormals included)."""
    rng = np.random.default_rng(41)
    x = rng.integers(0, 2**32, (9, width), dtype=np.uint32).view(np.float32)
    index = np.array([8, 0, 4, 4, 2], np.int32)
    assert same_bits(kernel_take_rows(prog, np, x, index), x[index])


@pytest.mark.parametrize("width", KV_STORE_WIDTHS)
def test_kv_store_writes_f16_rows_at_the_base_slot(prog, width):
    """kv_store writes astype(float16) of each row at slot base + row and leaves every other slot as it
    was (a store at the start, in the middle and filling the cache's last slot)."""
    rng = np.random.default_rng(42)
    capacity = 12
    for base, rows in ((0, 1), (5, 3), (capacity - 4, 4)):
        x = (rng.standard_normal((rows, width)) * 100).astype(np.float32)
        cache = np.full((capacity, width), SENTINEL, np.uint16)
        got = kernel_kv_store(prog, np, x, cache, base)
        expected = cache.copy()
        expected[base : base + rows] = x.astype(np.float16).view(np.uint16)
        assert np.array_equal(got, expected), f"base {base}, {rows} rows"


def test_kv_store_rounds_as_numpy(prog):
    """The f16 rounding of the cache store is numpy's astype(float16) on every tie between two finite
    f16 values (to even), the f32 values one ulp either side of each, subnormals (f16 and f32) and
    overflow to infinity, for both signs."""
    x = f16_rounding_cases(KV_STORE_WIDTHS[0])
    base = 3
    got = kernel_kv_store(prog, np, x, np.zeros((base + x.shape[0], x.shape[1]), np.uint16), base)
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16).view(np.uint16)
    assert np.array_equal(got[base:], expected)
    assert not got[:base].any()
