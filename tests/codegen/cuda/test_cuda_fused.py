"""The fused chains the renderer launches as one kernel give each value exactly what the kernels they
replace give: the residual add with the norm of its result (pointwise.rms_norm(residual=True)) and a
layer's key and value stores (gather.kv_store_pair), on the host emulation in both thread orders."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.codegen.cuda import emulator, gather, pointwise

NORMS = [(576, 1e-5, True), (640, 1e-6, True), (300, 1e-6, False)]  # width, eps, weighted
KV_WIDTH = 192


def _kernels() -> list:
    ks = []
    for width, eps, weighted in NORMS:
        ks += [pointwise.elementwise("add", width), pointwise.rms_norm(width, eps, 0, weighted),
               pointwise.rms_norm(width, eps, 0, weighted, residual=True)]
    return ks + [gather.kv_store(KV_WIDTH), gather.kv_store_pair(KV_WIDTH)]


@pytest.fixture(scope="module", params=[False, True], ids=["reverse", "forward"])
def host(request, tmp_path_factory):
    if emulator.unavailable_reason():
        pytest.skip(emulator.unavailable_reason())
    return emulator.HostProgram(_kernels(), forward=request.param, cache_dir=tmp_path_factory.mktemp("fused"))


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
    meta = np.array([7 + rows, 7], np.int32)
    want_k, want_v = np.zeros((capacity, KV_WIDTH), np.uint16), np.zeros((capacity, KV_WIDTH), np.uint16)
    host.launch(gather.kv_store(KV_WIDTH).name, rows, k, meta, want_k)
    host.launch(gather.kv_store(KV_WIDTH).name, rows, v, meta, want_v)
    got_k, got_v = np.zeros_like(want_k), np.zeros_like(want_v)
    host.launch(gather.kv_store_pair(KV_WIDTH).name, rows, k, v, meta, got_k, got_v)
    assert np.array_equal(got_k, want_k) and np.array_equal(got_v, want_v)
    assert np.array_equal(got_k[7 : 7 + rows], k.astype(np.float16).view(np.uint16))
