"""Batch invariance of the CUDA kernels on the host emulation: a row gives the same bits alone as in a
batch of other rows, wherever in the batch it sits (the contract of docs/architecture.md, "Exactness")."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_helpers import (
    ATTENTIONS,
    EMBED_WIDTHS,
    GEMV_SHAPES,
    KV_STORE_WIDTHS,
    NORMS,
    ROPES,
    TYPES,
    attention_inputs,
    kernel_attention,
    kernel_embed,
    kernel_gemm,
    kernel_kv_store,
    kernel_matmul,
    kernel_rms_norm,
    kernel_rope,
    quantize_rows,
    random_q8_0_table,
    random_weight,
)

from kinetic.codegen.cuda import gemv
from tests.device_checks import same_bits

BATCH = 7


def _batches(rng, width, size=BATCH, positions=(0, 3, BATCH - 1)):
    """One row alone, and batches of `size` holding it at each position (by default the first, a
    middle and the last)."""
    row = rng.standard_normal((1, width)).astype(np.float32)
    others = (rng.standard_normal((size - 1, width)) * 5).astype(np.float32)
    return row, [np.concatenate([others[:at], row, others[at:]]) for at in positions], positions


@pytest.mark.parametrize("wtype", TYPES, ids=lambda t: t.name)
def test_gemv_row_alone_equals_row_in_batch(host, wtype):
    """Quantizer + GEMV: a row's outputs alone equal its outputs in a batch of 7, at any position."""
    rng = np.random.default_rng(20)
    n, k = GEMV_SHAPES[wtype][-1]
    raw = random_weight(rng, wtype, n, k)
    row, batches, positions = _batches(rng, k)
    alone = kernel_matmul(host, np, row, raw, wtype)
    for batch, at in zip(batches, positions, strict=True):
        assert same_bits(kernel_matmul(host, np, batch, raw, wtype)[at : at + 1], alone), f"row at {at}"


@pytest.mark.parametrize("wtype", TYPES, ids=lambda t: t.name)
def test_gemm_row_alone_equals_row_in_batch(host, wtype):
    """Quantizer + GEMM (tiles of R rows): a row's outputs alone (a tile of one row) equal its outputs
    in a batch of 2R+3, first or last in a full tile, first or last in the partial last tile."""
    rng = np.random.default_rng(25)
    n, k = GEMV_SHAPES[wtype][-1]
    raw, tile = random_weight(rng, wtype, n, k), gemv.GEMM_ROWS[wtype]
    row, batches, positions = _batches(rng, k, 2 * tile + 3, (0, tile - 1, tile, 2 * tile, 2 * tile + 2))
    fmt = gemv.activation_format(wtype)
    alone = kernel_gemm(host, np, quantize_rows(host, np, row, fmt), raw, wtype)[:1]
    for batch, at in zip(batches, positions, strict=True):
        got = kernel_gemm(host, np, quantize_rows(host, np, batch, fmt), raw, wtype)
        assert same_bits(got[at : at + 1], alone), f"row at {at}"


@pytest.mark.parametrize("width,eps,group,weighted", NORMS)
def test_norm_row_alone_equals_row_in_batch(host, width, eps, group, weighted):
    """RMS norm: a row alone equals that row in a batch (its float64 tree does not see other rows)."""
    rng = np.random.default_rng(21)
    w = rng.standard_normal(group or width).astype(np.float32) if weighted else None
    row, batches, positions = _batches(rng, width)
    alone = kernel_rms_norm(host, np, row, eps, group, w)
    for batch, at in zip(batches, positions, strict=True):
        assert same_bits(kernel_rms_norm(host, np, batch, eps, group, w)[at : at + 1], alone)


@pytest.mark.parametrize("n_head,head_dim,n_rot,neox", ROPES[:1])
def test_rope_row_alone_equals_row_in_batch(host, n_head, head_dim, n_rot, neox):
    """Rotary: a row alone equals that row in a batch at the same position."""
    rng = np.random.default_rng(22)
    row, batches, positions = _batches(rng, n_head * head_dim)
    alone = kernel_rope(host, np, row, np.array([9], np.int32), n_head, head_dim, n_rot, neox)
    for batch, at in zip(batches, positions, strict=True):
        pos = np.arange(BATCH, dtype=np.int32) * 5
        pos[at] = 9
        assert same_bits(kernel_rope(host, np, batch, pos, n_head, head_dim, n_rot, neox)[at : at + 1], alone)


def test_attention_row_alone_equals_row_in_batch(host):
    """Attention: a row alone gives the bits it gets among other rows seeing other keys."""
    rng = np.random.default_rng(23)
    shape = ATTENTIONS[0]
    q, keys, values, visible = attention_inputs(rng, BATCH, 29, *shape)
    batch = kernel_attention(host, np, q, keys, values, visible, *shape)
    for at in (0, 3, BATCH - 1):
        alone = kernel_attention(host, np, q[at : at + 1].copy(), keys, values, visible[at : at + 1].copy(), *shape)
        assert same_bits(batch[at : at + 1], alone), f"row {at}"


def test_gathers_row_alone_equals_row_in_batch(host):
    """Embedding lookup and cache store: a row alone gives the bits it gets in a batch of 7, at any
    position (the token's values; the cache row written for it)."""
    rng = np.random.default_rng(24)
    table = random_q8_0_table(rng, 20, EMBED_WIDTHS[-1])
    tokens = np.array([4, 11, 0, 19, 4, 7, 2], np.int32)
    batch = kernel_embed(host, np, table, tokens)
    width = KV_STORE_WIDTHS[-1]
    x = (rng.standard_normal((BATCH, width)) * 100).astype(np.float32)
    cache = kernel_kv_store(host, np, x, np.zeros((BATCH + 2, width), np.uint16), 2)
    for at in (0, 3, BATCH - 1):
        assert same_bits(kernel_embed(host, np, table, tokens[at : at + 1]), batch[at : at + 1]), f"token {at}"
        alone = kernel_kv_store(host, np, x[at : at + 1].copy(), np.zeros((BATCH + 2, width), np.uint16), 2 + at)
        assert np.array_equal(alone[2 + at], cache[2 + at]), f"cache row {at}"
