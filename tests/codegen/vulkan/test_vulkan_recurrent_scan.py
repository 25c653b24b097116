"""The Vulkan kernels of the ops that carry a recurrent state (kinetic/codegen/vulkan/recurrent_scan.py:
short_conv, ssm_scan, delta_rule) and the C library's logf and a rounding-once float64 fma they rest on
(logf.py), against the reference bit for bit, each row of a tree pass continuing its parent's state."""

from __future__ import annotations

import struct
from fractions import Fraction

import numpy as np
import pytest
from vulkan_helpers import bits, spirv_val

from kinetic.codegen.vulkan import logf, recurrent_scan
from kinetic.codegen.vulkan.attention import expf_table_words
from kinetic.codegen.vulkan.device import Dispatch, Kernel
from kinetic.codegen.vulkan.elementwise import flat_index
from kinetic.codegen.vulkan.spirv import Module, Op
from kinetic.ir.numerics import recurrent as rnum
from kinetic.ir.numerics.floats import libm_f32
from tests.codegen import kernel_cases as cases

F32 = np.float32


def _walk_run(device, kernel: Kernel, inputs: list[np.ndarray], committed: np.ndarray, parents: np.ndarray,
              rows_total: int, out_width: int) -> tuple[np.ndarray, np.ndarray]:
    """Run a walking kernel on one pass: its inputs, the parents, the walk buffer (the committed
    states, then room for the states after each row) and out; returns (out, the states after)."""
    n = len(parents)
    size = committed[0].size
    walk = np.concatenate([committed.reshape(n, size), np.zeros((n, size), F32)])
    arrays = [*inputs, parents.view(np.uint32), walk]
    bufs = [device.upload(np.ascontiguousarray(a)) for a in arrays]
    out = device.buffer(n * out_width * 4)
    try:
        groups = -(-rows_total // recurrent_scan.WORKGROUP)
        device.run([Dispatch(kernel, [*bufs, out], (groups, 1, 1), struct.pack("<I", n))])
        after = bufs[-1].read(F32, 2 * n * size)[n * size:].reshape(committed.shape)
        return out.read(F32, n * out_width).reshape(n, out_width), after
    finally:
        for b in [*bufs, out]:
            device.free(b)


def test_the_modules_are_valid_spirv(device):
    """Each walking kernel and the logf / softplus windows pass spirv-val (Vulkan 1.2 rules)."""
    t = device.target
    for kernel in (recurrent_scan.render_short_conv(t, 33, 27), recurrent_scan.render_ssm_scan(t, 2, 4, 2, 96),
                   recurrent_scan.render_delta_rule(t, 2, 2, 76), logf.render_map("softplus")):
        spirv_val(kernel.spirv)


def _render_fma_f64_map() -> Kernel:
    m = Module()
    f64 = m.float_(64)
    a, b, c = (m.storage_buffer(i, f64, readonly=True, name=n) for i, n in enumerate("abc"))
    y = m.storage_buffer(3, f64, name="y")
    params, _ = m.push_constants([m.u32])
    fn = m.compute_entry((64, 1, 1))
    i = flat_index(fn, 64)
    with fn.if_(fn.icmp(Op.ULessThan, i, fn.push(params, 0, m.u32))):
        fn.buf_store(y, i, logf.fma_f64(fn, fn.buf_load(a, i), fn.buf_load(b, i), fn.buf_load(c, i)))
    fn.end()
    return Kernel("fma_f64_map", m.to_bytes(), (True, True, True, False), (64, 1, 1), push_size=4)


def test_fma_f64_rounds_once(device):
    """fma_f64 gives a*b + c rounded once (the exact value by fractions, correctly rounded) on 4000
    random doubles of mixed scales and signs, sums that cancel to a few bits, and ties that only the
    product's rounding error breaks."""
    if not device.caps.shader_float64:
        pytest.skip("no float64 on this device")
    rng = np.random.default_rng(70)
    n = 4000
    a = rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)
    b = rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)
    c = rng.standard_normal(n) * 2.0 ** rng.integers(-60, 60, n)
    c[: n // 4] = -(a[: n // 4] * b[: n // 4])  # the product's rounding error is all that is left
    c[n // 4: n // 2] = -(a[n // 4: n // 2] * b[n // 4: n // 2]) * (1 + 2.0 ** -40)
    # a product within 2^-107 of 2^-53 (rounded: exactly 2^-53, half an ulp of c in [1, 2)): c plus it is
    # a tie the product's tiny error must break (only the rounding to odd keeps that error)
    tie = slice(n // 2, 3 * n // 4)
    a[tie] = 1 + rng.integers(1, 1 << 20, n // 4) * 2.0 ** -26
    b[tie] = 2.0 ** -53 / a[tie]
    c[tie] = rng.uniform(1, 2, n // 4)
    bufs = [device.upload(np.ascontiguousarray(v)) for v in (a, b, c)]
    y = device.buffer(n * 8)
    try:
        device.run([Dispatch(_render_fma_f64_map(), [*bufs, y], (-(-n // 64), 1, 1), struct.pack("<I", n))])
        got = y.read(np.float64, n)
    finally:
        for buf in [*bufs, y]:
            device.free(buf)
    exact = np.array([float(Fraction(x) * Fraction(z) + Fraction(w)) for x, z, w in zip(a, b, c, strict=True)])
    assert np.array_equal(got.view(np.uint64), exact.view(np.uint64))


def _run_map(device, which: str, x: np.ndarray) -> np.ndarray:
    from kinetic.codegen.vulkan.ops import VulkanOps

    return VulkanOps(device)._run(logf.render_map(which), [x, expf_table_words()], x.shape,
                                  -(-x.size // logf.WORKGROUP), struct.pack("<I", x.size))


def test_logf_and_softplus_equal_the_c_library(device):
    """logf_libc gives the C library's logf bit for bit on 2^18 inputs spread over [1, 2^29) (softplus's
    whole range), 2^18 of every float bit pattern and the edges (1, zeros, infinities, NaN, subnormals,
    negatives); softplus gives numerics.recurrent.softplus's bits on 2^18 x of every scale from 1e-8 to
    1e3 of both signs, 20 and its neighbours (the pass-through edge) and expf's overflow and underflow."""
    if not device.caps.shader_float64:
        pytest.skip("no float64 on this device")
    rng = np.random.default_rng(71)
    n = 1 << 18
    special = np.array([1.0, 0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, 1e-40, 1e-45, 2.0, 0.5, 3.4e38], F32)
    x = np.concatenate([special, (2.0 ** rng.uniform(0, 29, n)).astype(F32),
                        rng.integers(0, 2**32, n, dtype=np.uint32).view(F32)])
    with np.errstate(all="ignore"):
        assert np.array_equal(bits(_run_map(device, "logf", x)), bits(libm_f32("logf", x)))
    edges = np.array([20.0, np.nextafter(F32(20), F32(0)), 20.5, -np.inf, np.inf, np.nan, -88.0, -104.0, 1e-30,
                      -1e-30, 88.7, 0.0, -0.0], F32)
    v = np.concatenate([edges, (rng.standard_normal(n) * 10.0 ** rng.integers(-8, 3, n)).astype(F32)])
    with np.errstate(all="ignore"):
        assert np.array_equal(bits(_run_map(device, "softplus", v)), bits(rnum.softplus(v)))


@pytest.mark.parametrize("channels, taps", cases.SHORT_CONVS)
def test_short_conv_follows_each_rows_path(device, channels, taps):
    """short_conv gives numerics.short_conv_row's bits for every row of a pass holding two sequences
    and a branch, each row continuing its parent's state (or its sequence's committed one), and
    leaves each row's window's last taps - 1 rows, bit for bit."""
    case = cases.short_conv_case(72, channels, taps)
    kernel = recurrent_scan.render_short_conv(device.target, channels, taps)
    out, after = _walk_run(device, kernel, case.inputs, case.committed, cases.PARENTS, channels, channels)
    assert np.array_equal(bits(out), bits(case.out))
    assert np.array_equal(bits(after), bits(case.after))


def test_a_row_in_a_pass_equals_the_row_alone(device):
    """Batch invariance: row 3 of the tree pass (a branch off row 1) gives the bits of its path (rows
    0, 1, 3) run as a pass of its own, output and state."""
    rng = np.random.default_rng(73)
    channels, taps = 64, 4
    x = rng.standard_normal((6, channels)).astype(F32)
    w = rng.standard_normal((channels, taps)).astype(F32)
    committed = rng.standard_normal((6, taps - 1, channels)).astype(F32)
    kernel = recurrent_scan.render_short_conv(device.target, channels, taps)
    out, after = _walk_run(device, kernel, [x, w], committed, cases.PARENTS, channels, channels)
    alone_out, alone_after = _walk_run(device, kernel, [x[cases.PATH], w], committed[cases.PATH],
                                       np.array([-1, 0, 1], np.int32), channels, channels)
    assert np.array_equal(bits(out[3]), bits(alone_out[2])) and np.array_equal(bits(after[3]), bits(alone_after[2]))


@pytest.mark.parametrize("n_head, head_dim, n_group, d_state", cases.SSM_SCANS)
def test_ssm_scan_follows_each_rows_path(device, n_head, head_dim, n_group, d_state):
    """ssm_scan gives numerics.ssm_scan_row's bits plus x * D for every row of a pass of two sequences
    and a branch, each continuing its parent's state, and leaves each row's state, bit for bit; dt
    spans softplus's both branches (above 20 and below)."""
    case = cases.ssm_scan_case(74, n_head, head_dim, n_group, d_state)
    channels = n_head * head_dim
    kernel = recurrent_scan.render_ssm_scan(device.target, n_head, head_dim, n_group, d_state)
    out, after = _walk_run(device, kernel, [*case.inputs, expf_table_words()], case.committed, cases.PARENTS, channels,
                           channels)
    assert np.array_equal(bits(out), bits(case.out))
    assert np.array_equal(bits(after), bits(case.after))


@pytest.mark.parametrize("n_k_head, n_v_head, head_dim", cases.DELTA_RULES)
def test_delta_rule_follows_each_rows_path(device, n_k_head, n_v_head, head_dim):
    """delta_rule gives the reference's bits (the decay expf(softplus(alpha) * A), sigmoid(beta),
    numerics.delta_rule_row) for every row of a pass of two sequences and a branch, each continuing its
    parent's state, and leaves each row's state, bit for bit; value heads read key head h % n_k_head."""
    case = cases.delta_rule_case(75, n_k_head, n_v_head, head_dim)
    width = n_v_head * head_dim
    kernel = recurrent_scan.render_delta_rule(device.target, n_k_head, n_v_head, head_dim)
    out, after = _walk_run(device, kernel, [*case.inputs, expf_table_words()], case.committed, cases.PARENTS, width,
                           width)
    assert np.array_equal(bits(out), bits(case.out))
    assert np.array_equal(bits(after), bits(case.after))
