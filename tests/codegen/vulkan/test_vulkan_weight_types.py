"""The weight formats of the popular K-quant mixes (Q5_K, Q3_K, Q2_K) and float tensors (F16, BF16) on
Vulkan: the matvec gives numerics.matmul's result for passes of 1, 2, 3, 8 and 17 rows, widths of
256 and 512 (float types also a width past their last 64-value chunk) and 13 outputs (not a whole
workgroup's), bit for bit on lavapipe (vulkan_helpers.assert_reference: exact where the device's
float operations are IEEE), a graph with such weights is one the Vulkan table accepts, and embedding
lookups from tables of the K-quant and float types give the reference's rows."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from vulkan_helpers import assert_reference, bits, random_weight

from kinetic.codegen.vulkan.kernels import unsupported
from kinetic.ir import numerics
from kinetic.ir.quants import dequantize_rows
from kinetic.passes.pipeline import run_pipeline
from tests.codegen.weight_graphs import matmul_graph
from tests.conftest import device_passes

ROWS = (1, 2, 3, 8, 17)
CASES = [(Q.Q5_K, 256), (Q.Q5_K, 512), (Q.Q3_K, 256), (Q.Q3_K, 512), (Q.Q2_K, 256), (Q.Q2_K, 512),
         (Q.F16, 256), (Q.F16, 512), (Q.F16, 352), (Q.BF16, 256), (Q.BF16, 512), (Q.BF16, 352)]


@pytest.mark.parametrize("wtype,k", CASES, ids=[f"{t.name}-k{k}" for t, k in CASES])
def test_matvec_equals_reference_for_every_row_count(ops, device, wtype, k):
    """1, 2, 3, 8 and 17 rows against 13 outputs: numerics.matmul's values (bit for bit on lavapipe)."""
    rng = np.random.default_rng(k + 7 * CASES.index((wtype, k)))
    raw = random_weight(rng, wtype, 13, k)
    wbuf = ops.upload_weight(raw, wtype)
    exact = device.caps.is_cpu and device.target.fma_mode != "unfused"
    try:
        for rows in ROWS:
            x = (rng.standard_normal((rows, k)) * 3).astype(np.float32)
            x[0, :2] = [0.0, -0.0]
            if wtype in (Q.F16, Q.BF16):  # f16's underflow and overflow; a subnormal (flushed for BF16)
                x[0, 2:5] = [1e-30, 7e4, 1e-39]
            ref = numerics.matmul(x, numerics.DequantizedWeight(raw, wtype))
            got = ops.matmul(x, raw, wtype, weight_buffer=wbuf)
            scale = float(np.nanmax(np.abs(ref[np.isfinite(ref)]))) if np.isfinite(ref).any() else 1.0
            assert_reference(got, ref, exact, rtol=0, atol=scale * 1e-3)
    finally:
        ops.device.free(wbuf)


@pytest.mark.parametrize("wtype", [Q.Q5_K, Q.Q3_K, Q.Q2_K, Q.F16, Q.BF16], ids=lambda t: t.name)
def test_the_table_accepts_the_type(wtype):
    """A matmul with these weights (after the pipeline, its reduction order named) is not refused."""
    assert unsupported(run_pipeline(matmul_graph(wtype, 13, 512), device_passes("vulkan"))) is None


TABLES = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.F16, Q.BF16]


@pytest.mark.parametrize("wtype", TABLES, ids=lambda t: t.name)
def test_embed_equals_reference(ops, wtype):
    """An embedding lookup from a table of this type gives dequantize_rows' values bit for bit (the
    reference's embed), for repeated and out-of-order ids."""
    rng = np.random.default_rng(90 + TABLES.index(wtype))
    table = random_weight(rng, wtype, 40, 512)
    ids = np.array([3, 39, 0, 3, 17])
    got = ops.embed(table, wtype, ids)
    np.testing.assert_array_equal(bits(got), bits(dequantize_rows(table, wtype, ids)))
