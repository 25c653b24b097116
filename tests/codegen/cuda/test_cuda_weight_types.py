"""The weight formats of the popular K-quant mixes (Q5_K, Q3_K, Q2_K) and float tensors (F16, BF16) on
CUDA's host emulation: the GEMV and the GEMM give numerics.matmul's result bit for bit for passes of
1, 2, 3, 8 and 17 rows, widths of 256 and 512 (float types also a width with a tail past their
64-value chunks) and 13 outputs (not a whole block's 4), a graph with such weights is one CUDA
renders, and embedding lookups from tables of the K-quant and float types give the reference's rows."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_helpers import (
    TABLE_WIDTH,
    WEIGHT_TYPE_CASES,
    kernel_gemm,
    kernel_gemv,
    quantize_rows,
    random_weight,
    reference_matmul,
)
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cuda import embed, gemv
from kinetic.codegen.cuda.renderer import CudaRenderer
from kinetic.ir.ops import Op
from kinetic.ir.quants import dequantize_rows
from kinetic.passes.pipeline import run_pipeline
from tests.codegen.weight_graphs import matmul_graph
from tests.conftest import device_passes
from tests.device_checks import same_bits

ROWS = (1, 2, 3, 8, 17)
CASES = [(t, n, k) for t, shapes in WEIGHT_TYPE_CASES.items() for n, k in shapes]


def _first_difference(got: np.ndarray, want: np.ndarray) -> str:
    bad = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
    at = tuple(int(i) for i in bad[0])
    return f"{len(bad)} values differ, first at {at}: {got[at]} vs {want[at]}"


@pytest.mark.parametrize("wtype,n,k", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_gemv_and_gemm_equal_reference(host, wtype, n, k):
    """For 1, 2, 3, 8 and 17 rows the GEMV's and the GEMM's rows equal numerics.matmul's bit for bit
    (which also makes every row in a batch equal the row alone)."""
    rng = np.random.default_rng(70 + k + list(WEIGHT_TYPE_CASES).index(wtype))
    raw = random_weight(rng, wtype, n, k)
    for rows in ROWS:
        x = (rng.standard_normal((rows, k)) * 3).astype(np.float32)
        x[0, :5] = [0.0, -0.0, 1e-30, 7e4, 1e-39]  # signed zeros, f16's underflow and overflow, a subnormal
        ref = reference_matmul(x, raw, wtype)
        acts = quantize_rows(host, np, x, gemv.activation_format(wtype))
        for name, got in (("GEMV", kernel_gemv(host, np, acts, raw, wtype)),
                          ("GEMM", kernel_gemm(host, np, acts, raw, wtype)[:rows])):
            assert same_bits(got, ref), f"{name} {wtype.name} n={n} k={k} rows={rows}: {_first_difference(got, ref)}"


@pytest.mark.parametrize("wtype", sorted(WEIGHT_TYPE_CASES, key=lambda t: t.name), ids=lambda t: t.name)
def test_renderer_runs_the_type(wtype):
    """A matmul with these weights renders to its GEMV and GEMM (after the device phase: a Q8_K
    quantize node before K-quants, none before F16), with nothing refused."""
    renderer = CudaRenderer()
    graph = renderer.lower(run_pipeline(matmul_graph(wtype, 13, 512), device_passes("cuda")))
    rendering = renderer.render(graph)
    assert not rendering.unsupported, rendering.unsupported
    names = {k.name for k in rendering.distinct()}
    assert {gemv.gemv(wtype, 13, 512).name, gemv.gemm(wtype, 13, 512).name} <= names
    quantizers = [n for n in graph.nodes if n.op is Op.QUANTIZE]
    assert [q.attrs.format for q in quantizers] == ([] if wtype in gemv.FLOAT else ["q8_k"])


TABLES = sorted(embed.SUPPORTED - {Q.Q8_0}, key=lambda t: t.name)


@pytest.mark.parametrize("wtype", TABLES, ids=lambda t: t.name)
def test_embed_equals_reference(host, wtype):
    """An embedding lookup from a table of this type gives dequantize_rows' values bit for bit (the
    reference's embed), for repeated and out-of-order ids."""
    rng = np.random.default_rng(90 + TABLES.index(wtype))
    table = random_weight(rng, wtype, 40, TABLE_WIDTH)
    tokens = np.array([3, 39, 0, 3, 17], np.int32)
    out = np.zeros((len(tokens), TABLE_WIDTH), np.float32)
    host.launch(embed.embed(wtype, TABLE_WIDTH).name, len(tokens), table, tokens, out)
    want = dequantize_rows(table, wtype, tokens)
    assert same_bits(out, want), f"{wtype.name}: {_first_difference(out, want)}"
