"""The CUDA kernels on a real GPU (through CuPy) against the IR reference, bit for bit as on the host
emulation, and batch invariance on the device. Marked gpu; skipped with the reason where CUDA is not
usable (scripts/gpu_check.sh runs them where a GPU is lent)."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_helpers import (
    ATTENTIONS,
    ELEMENTWISE_WIDTH,
    EMBED_WIDTHS,
    GEMV_SHAPES,
    KV_STORE_WIDTHS,
    NORMS,
    ROPES,
    TAKE_ROWS_WIDTHS,
    TYPES,
    attention_inputs,
    cache_with_garbage,
    edge_values,
    elementwise_case,
    f16_rounding_cases,
    kernel_attention,
    kernel_elementwise,
    kernel_embed,
    kernel_kv_store,
    kernel_matmul,
    kernel_rms_norm,
    kernel_rope,
    kernel_take_rows,
    kernels_under_test,
    random_q8_0_table,
    random_weight,
    reference_attention,
    reference_matmul,
)
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cuda import device, pointwise
from kinetic.ir import numerics
from kinetic.ir.interpreter import evaluate
from kinetic.ir.ops import Op, RopeAttrs
from kinetic.ir.quants import dequantize_rows
from tests.device_checks import same_bits

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(device.unavailable_reason() is not None, reason=device.unavailable_reason() or "")]


@pytest.fixture(scope="module")
def gpu():
    return device.GpuProgram(kernels_under_test())


@pytest.fixture(scope="module")
def cp():
    import cupy

    return cupy


@pytest.mark.parametrize("wtype", TYPES, ids=lambda t: t.name)
def test_gpu_gemv_equals_reference(gpu, cp, wtype):
    """On the GPU, quantizer + GEMV give numerics.matmul bit for bit, and a row alone what it gets in a
    batch."""
    rng = np.random.default_rng(30)
    for (n, k), rows in zip(GEMV_SHAPES[wtype], (1, 3, 5), strict=True):
        raw = random_weight(rng, wtype, n, k)
        x = rng.standard_normal((rows, k)).astype(np.float32)
        y = cp.asnumpy(kernel_matmul(gpu, cp, x, raw, wtype))
        assert same_bits(y, reference_matmul(x, raw, wtype)), f"{wtype.name} n={n} k={k}"
        alone = cp.asnumpy(kernel_matmul(gpu, cp, x[-1:].copy(), raw, wtype))
        assert same_bits(alone, y[-1:])


@pytest.mark.parametrize("op", sorted(pointwise.ELEMENTWISE))
def test_gpu_elementwise_equals_reference(gpu, cp, op):
    """Elementwise kernels on the GPU equal the interpreter bit for bit, edge values included (a
    broadcast op reads one row as its second operand)."""
    rng = np.random.default_rng(31)
    a = edge_values(rng, 3, ELEMENTWISE_WIDTH)
    b, ref = elementwise_case(op, a, (rng.standard_normal(a.shape) * 4).astype(np.float32))
    assert same_bits(cp.asnumpy(kernel_elementwise(gpu, cp, op, a, b)), ref)


@pytest.mark.parametrize("width,eps,group,weighted", NORMS)
def test_gpu_rms_norm_within_one_ulp(gpu, cp, width, eps, group, weighted):
    """RMS norm on the GPU is within one float32 ulp of the reference (float64 sum in another order)."""
    rng = np.random.default_rng(32)
    x = (rng.standard_normal((4, width)) * 3).astype(np.float32)
    w = rng.standard_normal(group or width).astype(np.float32) if weighted else None
    got = cp.asnumpy(kernel_rms_norm(gpu, cp, x, eps, group, w))
    ref = numerics.rms_norm(x, eps, group)
    if weighted:
        ref = (ref.reshape(4, -1, w.size) * w).reshape(x.shape).astype(np.float32)
    assert np.abs(got.view(np.int32).astype(np.int64) - ref.view(np.int32).astype(np.int64)).max() <= 1


@pytest.mark.parametrize("n_head,head_dim,n_rot,neox", ROPES)
def test_gpu_rope_equals_reference(gpu, cp, n_head, head_dim, n_rot, neox):
    """Rotary on the GPU equals the interpreter bit for bit."""
    rng = np.random.default_rng(33)
    x = rng.standard_normal((3, n_head * head_dim)).astype(np.float32)
    pos = np.array([0, 17, 40000], np.int32)
    got = cp.asnumpy(kernel_rope(gpu, cp, x, pos, n_head, head_dim, n_rot, neox))
    assert same_bits(got, evaluate(Op.ROPE, [x, pos], RopeAttrs(n_head=n_head, head_dim=head_dim, n_rot=n_rot,
                                                                theta=10000.0, neox=neox)))


@pytest.mark.parametrize("n_head,n_kv_head,head_dim", ATTENTIONS)
def test_gpu_attention_equals_reference(gpu, cp, n_head, n_kv_head, head_dim):
    """Attention on the GPU equals numerics.attention_online bit for bit (the device's double-precision
    expf is glibc's algorithm)."""
    rng = np.random.default_rng(34)
    q, keys, values, visible = attention_inputs(rng, 3, 37, n_head, n_kv_head, head_dim)
    got = cp.asnumpy(kernel_attention(gpu, cp, q, keys, values, visible, n_head, n_kv_head, head_dim))
    assert same_bits(got, reference_attention(q, keys, values, visible, n_head, n_kv_head, head_dim))


@pytest.mark.parametrize("n_head,n_kv_head,head_dim", ATTENTIONS)
def test_gpu_attention_reads_only_the_cached_keys(gpu, cp, n_head, n_kv_head, head_dim):
    """On the GPU, attention over a cache holding fewer keys than its capacity (garbage rows past
    meta[0], visible in the mask) equals the reference on the held keys."""
    rng = np.random.default_rng(35)
    shape = (n_head, n_kv_head, head_dim)
    q, keys, values, visible = attention_inputs(rng, 3, 29, *shape)
    cache_k, cache_v, mask = cache_with_garbage(rng, keys, values, visible)
    got = cp.asnumpy(kernel_attention(gpu, cp, q, cache_k, cache_v, mask, *shape, n_keys=29))
    assert same_bits(got, reference_attention(q, keys, values, visible, *shape))


@pytest.mark.parametrize("width", EMBED_WIDTHS)
def test_gpu_embed_equals_dequantize_rows(gpu, cp, width):
    """On the GPU, the Q8_0 embedding lookup equals dequantize_rows bit for bit (scales of every
    magnitude)."""
    rng = np.random.default_rng(36)
    table = random_q8_0_table(rng, 50, width)
    tokens = np.array([0, 49, 7, 7, 3], np.int32)
    got = cp.asnumpy(kernel_embed(gpu, cp, table, tokens))
    assert same_bits(got, dequantize_rows(table, Q.Q8_0, tokens).reshape(len(tokens), -1))


@pytest.mark.parametrize("width", TAKE_ROWS_WIDTHS)
def test_gpu_take_rows_copies_the_indexed_rows(gpu, cp, width):
    """On the GPU, take_rows copies the indexed rows' bits (NaN payloads included)."""
    rng = np.random.default_rng(37)
    x = rng.integers(0, 2**32, (9, width), dtype=np.uint32).view(np.float32)
    index = np.array([8, 0, 4, 4, 2], np.int32)
    assert same_bits(cp.asnumpy(kernel_take_rows(gpu, cp, x, index)), x[index])


def test_gpu_kv_store_rounds_as_numpy(gpu, cp):
    """On the GPU, the cache store (cvt.rn.f16.f32) is numpy's astype(float16) on every f16 tie, its
    neighbours, subnormals and overflow, written from the base slot on and nowhere else."""
    x = f16_rounding_cases(KV_STORE_WIDTHS[0])
    base = 3
    got = cp.asnumpy(kernel_kv_store(gpu, cp, x, np.zeros((base + x.shape[0], x.shape[1]), np.uint16), base))
    with np.errstate(over="ignore"):
        assert np.array_equal(got[base:], x.astype(np.float16).view(np.uint16))
    assert not got[:base].any()
