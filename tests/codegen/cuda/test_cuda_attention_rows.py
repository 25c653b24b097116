"""attention.attention_rows (8 warps per (row, head): scores in parallel, the softmax factors in
parallel, the accumulation alone sequential) against attention() and the IR reference, bit for bit,
on the host emulation in both thread orders: causal rows with a hole, a draft tree's mask, more keys
than threads (several keys per segment), keys past n_keys holding garbage, and a scale that rounds."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_helpers import attention_inputs, attention_scale, host_programs, reference_attention

from kinetic.codegen.cuda import attention, device, quantize

STRIDE = 640  # the mask stride (cache capacity) of these kernels: more keys than the 256 threads
SHAPES = [(9, 3, 64), (4, 1, 256), (2, 2, 128)]  # n_head, n_kv_head, head_dim: SmolLM2's, Gemma 3's, MHA


def _kernels() -> list:
    ks = []
    for n_head, n_kv, hd in SHAPES:
        scale = attention_scale(hd)
        ks += [attention.attention(n_head, n_kv, hd, scale, mask_stride=STRIDE),
               attention.attention_rows(n_head, n_kv, hd, scale, mask_stride=STRIDE)]
        ks += [attention.attention_rows(n_head, n_kv, hd, scale, mask_stride=STRIDE, quantize=fmt)
               for fmt in ("q8_0", "q8_1")]
        ks += [quantize.quantize(fmt, n_head * hd) for fmt in ("q8_0", "q8_1")]
        if hd == 256:  # a head is one Q8_K super-block
            ks += [attention.attention_rows(n_head, n_kv, hd, scale, mask_stride=STRIDE, quantize="q8_k"),
                   quantize.quantize("q8_k", n_head * hd)]
    return ks


host = host_programs(_kernels, "attn-rows")  # the kernels on the host, in both orders


def _run(host, kernel, q, keys, values, visible, n_keys, scratch: bool, extra=()):
    rows = q.shape[0]
    cache_k = np.zeros((STRIDE, keys.shape[1]), np.uint16)
    cache_v = np.zeros_like(cache_k)
    rng = np.random.default_rng(7)
    cache_k[:] = rng.integers(0, 65536, cache_k.shape)  # garbage past n_keys: must not be read into results
    cache_v[:] = rng.integers(0, 65536, cache_v.shape)
    cache_k[:n_keys], cache_v[:n_keys] = keys.view(np.uint16), values.view(np.uint16)
    mask = np.ones((rows, STRIDE), np.uint8)  # every key past n_keys marked visible: n_keys must bound it
    mask[:, :n_keys] = visible
    meta = np.array([n_keys, 0], np.int32)
    kv_rows = np.zeros((rows, 2), np.int32)  # every row's cache starts at key 0
    out = np.full(q.shape, np.nan, np.float32)
    work = [np.full((rows, kernel_heads(kernel), 2, STRIDE), np.nan, np.float32)] if scratch else []
    host.launch(kernel.name, rows, q, cache_k, cache_v, mask, meta, kv_rows, *work, out, *extra)
    return out


def kernel_heads(kernel) -> int:
    return kernel.blocks_x


@pytest.mark.parametrize("n_head,n_kv,hd", SHAPES)
@pytest.mark.parametrize("rows,n_keys", [(1, 1), (1, 37), (3, 300), (2, 600)])
def test_parallel_phases_equal_the_one_warp_kernel_and_the_reference(host, n_head, n_kv, hd, rows, n_keys):
    rng = np.random.default_rng(n_keys * 31 + rows)
    q, keys, values, visible = attention_inputs(rng, rows, n_keys, n_head, n_kv, hd) if n_keys > 3 else (
        (rng.standard_normal((rows, n_head * hd)) * 2).astype(np.float32),
        rng.standard_normal((n_keys, n_kv * hd)).astype(np.float16),
        rng.standard_normal((n_keys, n_kv * hd)).astype(np.float16),
        np.ones((rows, n_keys), bool))
    scale = attention_scale(hd)
    one_warp = _run(host, attention.attention(n_head, n_kv, hd, scale, mask_stride=STRIDE), q, keys, values,
                    visible, n_keys, scratch=False)
    parallel = _run(host, attention.attention_rows(n_head, n_kv, hd, scale, mask_stride=STRIDE), q, keys, values,
                    visible, n_keys, scratch=True)
    assert np.array_equal(parallel.view(np.uint32), one_warp.view(np.uint32))
    want = reference_attention(q, keys, values, visible, n_head, n_kv, hd)
    assert np.array_equal(parallel.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt,n_head,n_kv,hd", [(fmt, *shape) for fmt in ("q8_0", "q8_1") for shape in SHAPES]
                         + [("q8_k", 4, 1, 256)])
def test_the_output_row_quantized_in_the_same_launch(host, n_head, n_kv, hd, fmt):
    """attention_rows(quantize=fmt) also writes the output row as the output projection reads it: the
    quantizer's bits from the same values, written by the attention launch itself."""
    rng = np.random.default_rng(hd + len(fmt))
    rows, n_keys = 2, 45
    q, keys, values, visible = attention_inputs(rng, rows, n_keys, n_head, n_kv, hd)
    scale = attention_scale(hd)
    plain = _run(host, attention.attention_rows(n_head, n_kv, hd, scale, mask_stride=STRIDE), q, keys, values,
                 visible, n_keys, scratch=True)
    width = n_head * hd
    want = [np.zeros((rows, width), np.int8), np.zeros((rows, width // (256 if fmt == "q8_k" else 32)), np.float32)]
    want += [np.zeros((rows, width // 32), np.float32)] if fmt == "q8_1" else []
    host.launch(quantize.quantize(fmt, width).name, rows, plain, *want)
    got = [np.full_like(w, 7) for w in want]
    fused = _run(host, attention.attention_rows(n_head, n_kv, hd, scale, mask_stride=STRIDE, quantize=fmt), q, keys,
                 values, visible, n_keys, scratch=True, extra=got)
    assert np.array_equal(fused.view(np.uint32), plain.view(np.uint32))
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g.view(np.uint8), w.view(np.uint8))


def test_a_draft_trees_mask(host):
    """Rows of a tree see the committed keys and their ancestors only (not their siblings)."""
    n_head, n_kv, hd = SHAPES[0]
    rng = np.random.default_rng(3)
    committed, parents = 20, [-1, 0, 0, 1]
    n_keys = committed + len(parents)
    q = (rng.standard_normal((4, n_head * hd)) * 2).astype(np.float32)
    keys = rng.standard_normal((n_keys, n_kv * hd)).astype(np.float16)
    values = rng.standard_normal((n_keys, n_kv * hd)).astype(np.float16)
    visible = np.zeros((4, n_keys), bool)
    visible[:, :committed] = True
    for r in range(4):
        a = r
        while a >= 0:
            visible[r, committed + a] = True
            a = parents[a]
    scale = attention_scale(hd)
    got = _run(host, attention.attention_rows(n_head, n_kv, hd, scale, mask_stride=STRIDE), q, keys, values,
               visible, n_keys, scratch=True)
    want = reference_attention(q, keys, values, visible, n_head, n_kv, hd)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.gpu
@pytest.mark.skipif(device.unavailable_reason() is not None, reason=device.unavailable_reason() or "")
@pytest.mark.parametrize("n_head,n_kv,hd", SHAPES)
def test_gpu_attention_rows_equals_the_reference(n_head, n_kv, hd):
    """The same on a GPU, where the three phases run truly in parallel."""
    import cupy

    kernel = attention.attention_rows(n_head, n_kv, hd, attention_scale(hd), mask_stride=STRIDE)
    program = device.GpuProgram([kernel])
    rng = np.random.default_rng(5)
    rows, n_keys = 2, 600
    q, keys, values, visible = attention_inputs(rng, rows, n_keys, n_head, n_kv, hd)
    cache_k = np.zeros((STRIDE, keys.shape[1]), np.uint16)
    cache_v = np.zeros_like(cache_k)
    cache_k[:n_keys], cache_v[:n_keys] = keys.view(np.uint16), values.view(np.uint16)
    mask = np.zeros((rows, STRIDE), np.uint8)
    mask[:, :n_keys] = visible
    out = cupy.zeros(q.shape, cupy.float32)
    scratch = cupy.zeros((rows, n_head, 2, STRIDE), cupy.float32)
    program.launch(kernel.name, rows, cupy.asarray(q), cupy.asarray(cache_k), cupy.asarray(cache_v),
                   cupy.asarray(mask), cupy.asarray(np.array([n_keys, 0], np.int32)), scratch, out)
    want = reference_attention(q, keys, values, visible, n_head, n_kv, hd)
    assert np.array_equal(out.get().view(np.uint32), want.view(np.uint32))
