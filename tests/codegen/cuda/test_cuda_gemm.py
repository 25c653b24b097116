"""The row-tiled GEMM kernels (gemv.gemm): every row's result is the GEMV's, bit for bit, and so the
reference's, for every weight format, shape and row count (a partial last tile included), in both
thread orders on the host emulation and on a GPU where there is one; rows past `n_rows` are neither
read (the emulation raises on a read past the activations, which hold exactly n_rows rows) nor
written."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_helpers import (
    GEMM_SENTINEL,
    GEMV_SHAPES,
    TYPES,
    gemm_rows,
    kernel_gemm,
    kernel_gemv,
    kernels_under_test,
    quantize_rows,
    random_weight,
    reference_matmul,
)

from kinetic.codegen.cuda import device, gemv
from tests.device_checks import same_bits

needs_gpu = pytest.mark.skipif(device.unavailable_reason() is not None, reason=device.unavailable_reason() or "")


def _inputs(rng, wtype, n, k, rows):
    raw = random_weight(rng, wtype, n, k)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    x[0, :4] = 0.0
    return raw, x


def _differences(got, want) -> str:
    bad = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
    at = tuple(int(i) for i in bad[0])
    return f"{len(bad)} values differ, first at {at}: {got[at]} vs {want[at]}"


@pytest.mark.parametrize("wtype", TYPES, ids=lambda t: t.name)
def test_gemm_kernel_is_the_gemv_over_a_tile(wtype):
    """A GEMM kernel has the GEMV's block shape and parameters plus `n_rows`, a tile of 4 or 8 rows
    (GEMM_ROWS), and a grid of whole tiles."""
    for n, k in GEMV_SHAPES[wtype]:
        mv, mm = gemv.gemv(wtype, n, k), gemv.gemm(wtype, n, k)
        tile = gemv.GEMM_ROWS[wtype]
        assert tile in (4, 8) and mm.rows_per_block == tile and mv.rows_per_block == 1
        assert mm.kind == "gemm" and mm.name == f"gemm_{wtype.name.lower()}_n{n}_k{k}_r{tile}"
        assert [(p.name, p.ctype) for p in mm.params] == [(p.name, p.ctype) for p in mv.params] + [("n_rows", "int")]
        assert (mm.threads, mm.blocks_x) == (mv.threads, mv.blocks_x)
        assert [mm.grid(r)[1] for r in (1, tile, tile + 1, 2 * tile + 3)] == [1, 1, 2, 3]
        assert mv.grid(2 * tile + 3) == (mv.blocks_x, 2 * tile + 3)


@pytest.mark.parametrize("wtype", TYPES, ids=lambda t: t.name)
def test_gemm_equals_gemv_and_reference(host, host_forward, wtype):
    """For every shape and 1, R-1, R, R+1 and 2R+3 rows (R the tile), the GEMM's rows equal the
    GEMV's and numerics.matmul's bit for bit, with warps and lanes in either order."""
    rng = np.random.default_rng(40 + TYPES.index(wtype))
    for n, k in GEMV_SHAPES[wtype]:
        for rows in gemm_rows(wtype):
            raw, x = _inputs(rng, wtype, n, k, rows)
            ref = reference_matmul(x, raw, wtype)
            for prog in (host, host_forward):
                order = "forward" if prog is host_forward else "reverse"
                acts = quantize_rows(prog, np, x, gemv.activation_format(wtype))
                results = {"GEMV": kernel_gemv(prog, np, acts, raw, wtype),
                           "GEMM": kernel_gemm(prog, np, acts, raw, wtype)[:rows]}
                for name, got in results.items():
                    assert same_bits(got, ref), f"{name} {wtype.name} n={n} k={k} rows={rows} ({order}): " \
                                                f"{_differences(got, ref)}"


@pytest.mark.parametrize("wtype", TYPES, ids=lambda t: t.name)
def test_gemm_writes_no_row_past_n_rows(host, host_forward, wtype):
    """The rows of the last tile at or past n_rows keep y's sentinel bits in both thread orders (and
    the activations' rows past n_rows, which do not exist, are never read: the emulation would
    raise)."""
    rng = np.random.default_rng(50 + TYPES.index(wtype))
    n, k = GEMV_SHAPES[wtype][-1]
    for rows in gemm_rows(wtype):
        raw, x = _inputs(rng, wtype, n, k, rows)
        for prog in (host, host_forward):
            y = kernel_gemm(prog, np, quantize_rows(prog, np, x, gemv.activation_format(wtype)), raw, wtype)
            assert np.all(y[rows:].view(np.uint32) == GEMM_SENTINEL), f"{wtype.name} rows={rows}"
            assert not np.any(y[:rows].view(np.uint32) == GEMM_SENTINEL)


@pytest.fixture(scope="module")
def gpu():
    return device.GpuProgram(kernels_under_test())


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("wtype", TYPES, ids=lambda t: t.name)
def test_gpu_gemm_equals_gemv_and_reference(gpu, wtype):
    """On the GPU, the GEMM's rows equal the GEMV's and numerics.matmul's bit for bit for every shape
    and row count, and the rows past n_rows keep their sentinel bits."""
    import cupy as cp

    rng = np.random.default_rng(60 + TYPES.index(wtype))
    for n, k in GEMV_SHAPES[wtype]:
        for rows in gemm_rows(wtype):
            raw, x = _inputs(rng, wtype, n, k, rows)
            ref = reference_matmul(x, raw, wtype)
            acts = quantize_rows(gpu, cp, x, gemv.activation_format(wtype))
            at = f"{wtype.name} n={n} k={k} rows={rows}"
            assert same_bits(cp.asnumpy(kernel_gemv(gpu, cp, acts, raw, wtype)), ref), f"GEMV {at}"
            y = cp.asnumpy(kernel_gemm(gpu, cp, acts, raw, wtype))
            assert same_bits(y[:rows], ref), f"GEMM {at}"
            assert np.all(y[rows:].view(np.uint32) == GEMM_SENTINEL), f"GEMM {at}: a row past n_rows was written"
