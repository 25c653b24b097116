"""The fused chains the renderer launches as one kernel give each value exactly what the kernels they
replace give: the residual add with the norm of its result (pointwise.rms_norm(residual=True)) and a
layer's key and value stores (gather.kv_store(pair=True)), on the host emulation in both thread orders."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_helpers import host_programs

from kinetic.codegen.cuda import gather, pointwise, quantize

NORMS = [(576, 1e-5, True), (640, 1e-6, True), (320, 1e-6, False)]  # width, eps, weighted
QUANT_FORMATS = ("q8_0", "q8_1")
ROPE_PAIRS = [(9, 3, 64, 64, False), (4, 1, 256, 256, True), (4, 2, 64, 32, True)]  # q heads, k heads, ...
GLU_OPS, GLU_WIDTH = ("swiglu", "geglu"), 1536 + 32  # not a multiple of a block's 256 threads
K_WIDTH = 2048  # Gemma 3's feed-forward width: 8 super-blocks of 256 (Q8_K, for Q4_K/Q6_K)
KV_WIDTH = 192


def _kernels() -> list:
    ks = []
    for width, eps, weighted in NORMS:
        ks += [pointwise.elementwise("add", width), pointwise.rms_norm(width, eps, 0, weighted),
               pointwise.rms_norm(width, eps, 0, weighted, residual=True)]
        for fmt in QUANT_FORMATS:
            ks += [quantize.quantize(fmt, width), pointwise.rms_norm(width, eps, 0, weighted, quantize=fmt),
                   pointwise.rms_norm(width, eps, 0, weighted, residual=True, quantize=fmt)]
    for op in GLU_OPS:
        ks += [pointwise.elementwise(op, GLU_WIDTH), quantize.quantize("q8_0", GLU_WIDTH),
               quantize.quantize("q8_1", GLU_WIDTH)]
        ks += [pointwise.elementwise(op, GLU_WIDTH, quantize=fmt) for fmt in QUANT_FORMATS]
        ks += [pointwise.elementwise(op, K_WIDTH), pointwise.elementwise(op, K_WIDTH, quantize="q8_k")]
    ks.append(quantize.quantize("q8_k", K_WIDTH))
    for hq, hk, hd, n_rot, neox in ROPE_PAIRS:
        ks += [pointwise.rope(hq, hd, n_rot, neox), pointwise.rope(hk, hd, n_rot, neox),
               pointwise.rope(hq, hd, n_rot, neox, n_head_b=hk)]
    return ks + [gather.kv_store(KV_WIDTH), gather.kv_store(KV_WIDTH, pair=True)]


host = host_programs(_kernels, "fused")  # the kernels on the host, in both orders


@pytest.mark.parametrize("width,eps,weighted", NORMS)
def test_add_and_norm_in_one_launch_equal_the_two(host, width, eps, weighted):
    rng = np.random.default_rng(width)
    rows = 5
    x = (rng.standard_normal((rows, width)) * rng.choice([1e-3, 1.0, 50.0], (rows, 1))).astype(np.float32)
    y = rng.standard_normal((rows, width)).astype(np.float32)
    weight = [rng.standard_normal(width).astype(np.float32)] if weighted else []
    total, normed = np.zeros_like(x), np.zeros_like(x)
    host.launch(pointwise.elementwise("add", width).name, rows, x, y, total)
    host.launch(pointwise.rms_norm(width, eps, 0, weighted).name, rows, total, *weight, normed)
    fused_sum, fused_norm = np.full_like(x, np.nan), np.full_like(x, np.nan)
    host.launch(pointwise.rms_norm(width, eps, 0, weighted, residual=True).name, rows, x, y, *weight,
                fused_sum, fused_norm)
    assert np.array_equal(fused_sum.view(np.uint32), total.view(np.uint32))
    assert np.array_equal(fused_norm.view(np.uint32), normed.view(np.uint32))


def test_key_and_value_stores_in_one_launch_equal_the_two(host):
    rng = np.random.default_rng(1)
    rows, capacity = 3, 16
    k = (rng.standard_normal((rows, KV_WIDTH)) * 1000).astype(np.float32)
    v = rng.standard_normal((rows, KV_WIDTH)).astype(np.float32)
    kv_rows = np.stack([7 + np.arange(rows), np.zeros(rows)], axis=1).astype(np.int32)  # slots 7, 8, 9
    want_k, want_v = np.zeros((capacity, KV_WIDTH), np.uint16), np.zeros((capacity, KV_WIDTH), np.uint16)
    host.launch(gather.kv_store(KV_WIDTH).name, rows, k, kv_rows, want_k)
    host.launch(gather.kv_store(KV_WIDTH).name, rows, v, kv_rows, want_v)
    got_k, got_v = np.zeros_like(want_k), np.zeros_like(want_v)
    host.launch(gather.kv_store(KV_WIDTH, pair=True).name, rows, k, v, kv_rows, got_k, got_v)
    assert np.array_equal(got_k, want_k) and np.array_equal(got_v, want_v)
    assert np.array_equal(got_k[7 : 7 + rows], k.astype(np.float16).view(np.uint16))


@pytest.mark.parametrize("fmt", QUANT_FORMATS)
@pytest.mark.parametrize("width,eps,weighted", NORMS)
@pytest.mark.parametrize("residual", [False, True], ids=["norm", "add_norm"])
def test_norm_and_quantizer_in_one_launch_equal_the_two(host, width, eps, weighted, residual, fmt):
    """rms_norm(quantize=fmt) writes the norm's values as the plain kernel does and the quantized row
    as quantize.quantize(fmt) gives it from them (int8 values, f16-rounded scales, Q8_1's sums), rows of
    every scale including an all-zero one."""
    rng = np.random.default_rng(width + len(fmt))
    rows = 4
    x = (rng.standard_normal((rows, width)) * rng.choice([1e-3, 1.0, 50.0], (rows, 1))).astype(np.float32)
    x[2] = 0.0
    y = rng.standard_normal((rows, width)).astype(np.float32) if residual else None
    if residual:
        y[2] = 0.0
    weight = [rng.standard_normal(width).astype(np.float32)] if weighted else []
    ins = [x, y] if residual else [x]
    want_out, sums = np.zeros_like(x), [np.zeros_like(x)] if residual else []
    host.launch(pointwise.rms_norm(width, eps, 0, weighted, residual).name, rows, *ins, *weight, *sums, want_out)
    acts = [np.zeros((rows, width), np.int8), np.zeros((rows, width // 32), np.float32)]
    acts += [np.zeros((rows, width // 32), np.float32)] if fmt == "q8_1" else []
    host.launch(quantize.quantize(fmt, width).name, rows, want_out, *acts)
    got_out, got_sums = np.full_like(x, np.nan), [np.full_like(x, np.nan)] if residual else []
    got = [np.full_like(a, 7) for a in acts]
    host.launch(pointwise.rms_norm(width, eps, 0, weighted, residual, quantize=fmt).name, rows, *ins, *weight,
                *got_sums, got_out, *got)
    assert np.array_equal(got_out.view(np.uint32), want_out.view(np.uint32))
    for g, w in zip(got, acts, strict=True):
        assert np.array_equal(g.view(np.uint8), w.view(np.uint8))


@pytest.mark.parametrize("fmt", QUANT_FORMATS)
@pytest.mark.parametrize("op", GLU_OPS)
def test_glu_and_quantizer_in_one_launch_equal_the_two(host, op, fmt):
    """SwiGLU / GEGLU with the down projection's quantizer: the same values and the same quantized row
    as the two launches."""
    from kinetic.ir import numerics

    rng = np.random.default_rng(len(op) + len(fmt))
    rows, width = 3, GLU_WIDTH
    x = (rng.standard_normal((rows, width)) * 3).astype(np.float32)
    y = rng.standard_normal((rows, width)).astype(np.float32)
    table = [numerics.gelu_table().view(np.uint16)] if op == "geglu" else []
    want = np.zeros_like(x)
    host.launch(pointwise.elementwise(op, width).name, rows, x, y, *table, want)
    acts = [np.zeros((rows, width), np.int8), np.zeros((rows, width // 32), np.float32)]
    acts += [np.zeros((rows, width // 32), np.float32)] if fmt == "q8_1" else []
    host.launch(quantize.quantize(fmt, width).name, rows, want, *acts)
    got, got_acts = np.full_like(x, np.nan), [np.full_like(a, 7) for a in acts]
    host.launch(pointwise.elementwise(op, width, quantize=fmt).name, rows, x, y, *table, got, *got_acts)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    for g, w in zip(got_acts, acts, strict=True):
        assert np.array_equal(g.view(np.uint8), w.view(np.uint8))


@pytest.mark.parametrize("hq,hk,hd,n_rot,neox", ROPE_PAIRS)
def test_query_and_key_rotations_in_one_launch_equal_the_two(host, hq, hk, hd, n_rot, neox):
    rng = np.random.default_rng(hq * 10 + hk)
    rows = 3
    xq = rng.standard_normal((rows, hq * hd)).astype(np.float32)
    xk = rng.standard_normal((rows, hk * hd)).astype(np.float32)
    angles = rng.uniform(-50, 50, (rows, n_rot // 2))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    want_q, want_k = np.zeros_like(xq), np.zeros_like(xk)
    host.launch(pointwise.rope(hq, hd, n_rot, neox).name, rows, xq, cos, sin, want_q)
    host.launch(pointwise.rope(hk, hd, n_rot, neox).name, rows, xk, cos, sin, want_k)
    got_q, got_k = np.full_like(xq, np.nan), np.full_like(xk, np.nan)
    host.launch(pointwise.rope(hq, hd, n_rot, neox, n_head_b=hk).name, rows, xq, xk, cos, sin, got_q, got_k)
    assert np.array_equal(got_q.view(np.uint32), want_q.view(np.uint32))
    assert np.array_equal(got_k.view(np.uint32), want_k.view(np.uint32))


@pytest.mark.parametrize("op", GLU_OPS)
def test_glu_and_q8_k_quantizer_in_one_launch_equal_the_two(host, op):
    """The same for Q8_K (the down projection's format when it is Q4_K or Q6_K): the value of largest
    magnitude per 256 found across the block's 8 warps, a super-block of zeros included: the same int8
    values and scales as the quantizer's."""
    from kinetic.ir import numerics

    rng = np.random.default_rng(len(op))
    rows, width = 3, K_WIDTH
    x = (rng.standard_normal((rows, width)) * 3).astype(np.float32)
    y = rng.standard_normal((rows, width)).astype(np.float32)
    x[2, :256] = 0.0
    table = [numerics.gelu_table().view(np.uint16)] if op == "geglu" else []
    want = np.zeros_like(x)
    host.launch(pointwise.elementwise(op, width).name, rows, x, y, *table, want)
    acts = [np.zeros((rows, width), np.int8), np.zeros((rows, width // 256), np.float32)]
    host.launch(quantize.quantize("q8_k", width).name, rows, want, *acts)
    got, got_acts = np.full_like(x, np.nan), [np.full_like(a, 7) for a in acts]
    host.launch(pointwise.elementwise(op, width, quantize="q8_k").name, rows, x, y, *table, got, *got_acts)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    for g, w in zip(got_acts, acts, strict=True):
        assert np.array_equal(g.view(np.uint8), w.view(np.uint8))
