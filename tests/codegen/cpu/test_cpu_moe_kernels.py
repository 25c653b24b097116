"""The generated router and weighted-sum kernels (kinetic/codegen/cpu/moe_ir.py) against the
numerics they mirror (kinetic/ir/numerics/moe.py), bit for bit, on random rows with exact ties."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from kinetic.codegen.cpu import moe_ir
from kinetic.ir.numerics import moe as moe_numerics

F32 = np.float32
_SIGNATURE = ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * 5)


def _run(jit, rendered, x: np.ndarray, b: np.ndarray | None, y_shape: tuple, r0: int = 0, r1: int | None = None):
    """The kernel on x (and b) into a fresh y (NaN where it does not write)."""
    kernel = _SIGNATURE(jit.address(*rendered))
    x = np.ascontiguousarray(x, F32)
    b = np.ascontiguousarray(b if b is not None else np.zeros(1), F32)
    y = np.full(y_shape, np.nan, F32)
    kernel(x.ctypes.data, b.ctypes.data, y.ctypes.data, r0, y_shape[0] if r1 is None else r1)
    return y


def _logits(rng, rows: int, n: int) -> np.ndarray:
    """Router logits with exact ties (values drawn from a small set) and a wide range."""
    x = rng.standard_normal((rows, n)).astype(F32) * F32(4)
    ties = rng.random((rows, n)) < 0.3
    x[ties] = rng.choice(np.array([-1.5, 0.0, 0.25, 2.0], F32), ties.sum())
    x[0] = F32(0.5)  # one row of all-equal values
    return x


@pytest.mark.parametrize("n_expert", [4, 16, 20, 60, 128])
@pytest.mark.parametrize("gating", ["softmax", "sigmoid"])
def test_gate_kernel_equals_the_numerics(jit, n_expert, gating):
    """The gate kernel gives numerics.moe.gate's probabilities bit for bit (softmax blocks of 16 and
    the tail, sigmoid), for rows r0..r1 of a call."""
    x = _logits(np.random.default_rng(n_expert), 9, n_expert)
    want = moe_numerics.gate(x, gating)
    got = _run(jit, moe_ir.render_gate(n_expert, gating), x, None, x.shape)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    part = _run(jit, moe_ir.render_gate(n_expert, gating), x, None, x.shape, 3, 7)
    np.testing.assert_array_equal(part[3:7].view(np.uint32), want[3:7].view(np.uint32))
    assert np.isnan(part[:3]).all() and np.isnan(part[7:]).all()


@pytest.mark.parametrize("n_expert", [4, 9, 20, 64])
@pytest.mark.parametrize("biased", [False, True])
def test_select_kernel_equals_the_numerics_for_every_top_k(jit, n_expert, biased):
    """The selection kernel picks numerics.moe.top_k's experts in its order (ties: the lower expert)
    for every k from 1 to n_expert, with and without the selection bias."""
    rng = np.random.default_rng(100 + n_expert)
    probs = moe_numerics.gate(_logits(rng, 12, n_expert), "softmax")
    probs[1, ::2] = probs[1, 1]  # exact ties between probabilities
    bias = (rng.choice(np.array([0.0, 0.125, -0.5], F32), n_expert)).astype(F32) if biased else None
    scores = (probs + bias).astype(F32) if biased else probs
    for k in range(1, n_expert + 1):
        want = moe_numerics.top_k(scores, k).astype(F32)
        got = _run(jit, moe_ir.render_select(n_expert, k, biased), probs, bias, (len(probs), k))
        np.testing.assert_array_equal(got, want, err_msg=f"k={k}")


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("scale", [0.0, 1.0, 2.5, 0.3])
def test_weights_kernel_equals_the_numerics(jit, normalize, scale):
    """The routing-weights kernel gives numerics.moe.route_weights bit for bit: gathered by id,
    summed in a double, clamped, divided, scaled unless the scale is 0 or 1."""
    n_expert, k = 20, 4
    rng = np.random.default_rng(3)
    probs = moe_numerics.gate(_logits(rng, 10, n_expert), "sigmoid")
    probs[2] = F32(1e-9)  # a sum under the clamp
    ids = moe_numerics.top_k(probs, k)
    want = moe_numerics.route_weights(probs, ids, normalize=normalize, scale=scale)
    got = _run(jit, moe_ir.render_weights(n_expert, k, normalize, scale), probs, ids.astype(F32), want.shape)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize(("k", "width"), [(1, 64), (2, 96), (4, 1024), (8, 40)])
def test_sum_kernel_equals_the_numerics(jit, k, width):
    """The weighted-sum kernel gives numerics.moe.weighted_sum bit for bit (each product rounded,
    the slots added in order, no fused multiply-add)."""
    rng = np.random.default_rng(k * width)
    outputs = (rng.standard_normal((5, k * width)) * 3).astype(F32)
    weights = rng.random((5, k)).astype(F32)
    want = moe_numerics.weighted_sum(outputs, weights)
    got = _run(jit, moe_ir.render_sum(k, width), outputs, weights, want.shape)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
