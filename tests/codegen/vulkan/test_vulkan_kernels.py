"""Elementwise, RMS norm and rotary kernels on the Vulkan device against the IR reference
(`kinetic.ir.numerics`, the interpreter's arithmetic), on random inputs.

What "matches" means, per kernel: the kernels follow the reference's operations in its order, and
every fma rounds once (the device's Fma when the probe finds it fused, float64 otherwise). Kernels
made only of IEEE-exact operations (add, mul, fma, conversions: add/mul/scale/GELU/GEGLU/rotary) are
then bit-identical on any device. Division and square root are exact on lavapipe (LLVM's IEEE
instructions) but Vulkan allows 2.5 ulp elsewhere, so kernels with them (SiLU, SwiGLU, RMS norm) are
compared bit for bit on CPU devices and within a few ulps on others. Within the device the contract
is exact: a row computed in a batch equals the row alone, and runs repeat bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from vulkan_helpers import assert_reference, bits

from kinetic.ir import numerics
from kinetic.ir.interpreter import evaluate
from kinetic.ir.ops import Op, RopeAttrs
from tests.rotary_cases import SCALINGS, scaled

F32 = np.float32
EDGES = np.array([0.0, -0.0, 1e-30, -1e-30, 1e-6, -3e-5, 0.5, -0.5, 9.999, -9.999, 10.0, -10.0, 10.001, -10.001,
                  80.0, -80.0, 88.5, -88.5, 89.0, -89.0, 100.0, -100.0, 1e4, -1e4, 65519.0, 65520.0, -7e4], F32)


def _exact(device, division: bool) -> bool:
    if device.target.fma_mode == "unfused":
        return False
    return device.caps.is_cpu or not division


def _inputs(rows: int, width: int, seed: int, spread: float = 3.0) -> np.ndarray:
    x = (np.random.default_rng(seed).standard_normal((rows, width)) * spread).astype(F32)
    n = min(EDGES.size, x.size)
    x.reshape(-1)[:n] = EDGES[:n]
    return x


REFERENCE = {
    "add": lambda a, b: (a + b).astype(F32),
    "mul": lambda a, b: (a * b).astype(F32),
    "swiglu": lambda a, b: (numerics.silu(a) * b).astype(F32),
    "geglu": lambda a, b: (numerics.gelu_ggml(a) * b).astype(F32),
    "silu": numerics.silu,
    "gelu": numerics.gelu_ggml,
}


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # the reference's f16 index of |x| > 65519
@pytest.mark.parametrize("op", ["add", "mul", "silu", "gelu", "swiglu", "geglu"])
def test_elementwise_matches_reference(ops, device, op):
    """Each activation equals the reference on random values and edge cases (exp overflow and
    underflow, GELU's +-10 cut-offs, f16 subnormals and overflow in the table index)."""
    a, b = _inputs(6, 1000, 1, spread=20.0), _inputs(6, 1000, 2)
    args = (a, b) if op in ("add", "mul", "swiglu", "geglu") else (a,)
    got = ops.elementwise(op, *args)
    assert_reference(got, REFERENCE[op](*args), _exact(device, op in ("silu", "swiglu")), rtol=4e-7, atol=1e-37)


def test_scale_matches_reference(ops, device):
    """scale multiplies by the factor rounded to float32, one rounding."""
    x = _inputs(3, 700, 3)
    for factor in (0.125, 1 / 3, 1e-3):
        assert_reference(ops.elementwise("scale", x, factor=factor), (x * F32(factor)).astype(F32),
                         _exact(device, False))


def test_softcap_is_the_c_library_tanhf(ops, device):
    """The soft-cap kernel with cap 1 (tanhf itself) gives the C library's tanhf bits for values from
    every branch of tanhf and its expm1f (exact where the device divides exactly, as lavapipe does)."""
    from kinetic.codegen.common.libm import libm_map
    from tests.codegen.common.test_common_tanhf import branch_values

    x = branch_values(1 << 13)
    assert_reference(ops.elementwise("softcap", x, factor=1.0), libm_map("tanhf", x), _exact(device, True))


@pytest.mark.parametrize("group,weighted", [(0, True), (0, False), (64, True), (64, False)])
def test_rms_norm_float64_accumulation_matches_reference(ops, device, group, weighted):
    """RMS norm with float64 sums of squares (the reference's own accumulation type) over whole rows
    or per-head groups, with a full-width or per-group weight."""
    if not device.caps.shader_float64:
        pytest.skip("no shaderFloat64 on this device")
    ops.f64_norm = True
    x = _inputs(7, 576, 4, spread=1.5)
    w = np.random.default_rng(5).standard_normal(group or 576).astype(F32) if weighted else None
    got = ops.rms_norm(x, 1e-6, group, w)
    ref = numerics.rms_norm(x, 1e-6, group)
    if weighted:
        ref = (ref.reshape(7, -1, w.size) * w).reshape(ref.shape).astype(F32)
    assert_reference(got, ref, _exact(device, True), rtol=2e-6)


def test_rms_norm_float32_accumulation_is_close(ops):
    """With float32 sums (devices without float64) the mean carries float32 rounding along a chain of
    g/64 + 6 additions; the result stays within 4e-6 relative of the reference."""
    ops.f64_norm = False
    x = _inputs(5, 2048, 6, spread=1.0)
    np.testing.assert_allclose(ops.rms_norm(x, 1e-5), numerics.rms_norm(x, 1e-5), rtol=4e-6)


@pytest.mark.parametrize("f64", [True, False])
def test_rms_norm_is_batch_invariant_and_deterministic(ops, device, f64):
    """A row normalized among 1..8 rows gives the bits it gets alone, run after run."""
    if f64 and not device.caps.shader_float64:
        pytest.skip("no shaderFloat64 on this device")
    ops.f64_norm = f64
    x = _inputs(8, 960, 7)
    alone = np.concatenate([ops.rms_norm(x[r : r + 1], 1e-6) for r in range(8)])
    for n in range(1, 9):
        np.testing.assert_array_equal(bits(ops.rms_norm(x[:n], 1e-6)), bits(alone[:n]))


def _rope_attrs(n_head, head_dim, n_rot, neox, theta=10000.0):
    return RopeAttrs(n_head=n_head, head_dim=head_dim, n_rot=n_rot, theta=theta, neox=neox)


@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("n_head,head_dim,n_rot,neox", [(9, 64, 64, False), (4, 256, 256, True),
                                                        (3, 128, 64, True), (2, 64, 32, False)])
def test_rope_matches_reference(ops, device, n_head, head_dim, n_rot, neox, scaling):
    """Rotary embedding in the normal and NeoX layouts, full and partial n_rot, at scattered
    positions, with each rotary scaling: the interpreter's result (fma-contracted rotation, host
    cos/sin table with the scaling in it)."""
    rows = 6
    x = _inputs(rows, n_head * head_dim, 8)
    positions = np.array([0, 1, 7, 100, 4095, 32767], np.int32)
    a = scaled(_rope_attrs(n_head, head_dim, n_rot, neox), scaling)
    got = ops.rope(x, positions, a)
    assert_reference(got, evaluate(Op.ROPE, [x, positions], a), _exact(device, False), rtol=1e-6, atol=1e-6)
    alone = ops.rope(x[3:4], positions[3:4], a)
    np.testing.assert_array_equal(bits(got[3:4]), bits(alone))


def test_elementwise_kernels_serve_any_length(ops, device):
    """One kernel per op serves any element count (a push constant), including counts that leave a
    partial workgroup and counts needing a second grid row."""
    for n in (1, 255, 257):
        a, b = _inputs(1, n, n), _inputs(1, n, n + 1)
        assert_reference(ops.elementwise("add", a, b), (a + b).astype(F32), True)
    limit = device.caps.max_workgroup_count[0]
    if limit * 256 < 40_000_000:  # a second grid row is reachable with a moderate buffer
        n = limit * 256 + 300
        a = np.ones((1, n), F32)
        assert_reference(ops.elementwise("add", a, a), np.full((1, n), 2, F32), True)
