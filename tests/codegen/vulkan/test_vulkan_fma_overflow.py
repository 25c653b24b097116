"""The Vulkan renderers' fma (builders.fma) at the top of float32's range: the device's Fma where it
rounds once, and the float64 path (an exact product and sum, corrected at float32 midpoints) that
lavapipe runs, give numerics.fma_f32's bits, overflow to +-inf and the overflow edge included."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.codegen.vulkan import builders, spirv
from kinetic.codegen.vulkan.builders import Target
from kinetic.codegen.vulkan.device import Dispatch, Kernel
from kinetic.ir import numerics
from tests.ir.test_fma_overflow import overflow_cases

WORKGROUP = 64


def _fma_kernel(target: Target) -> Kernel:
    """out[i] = fma(a[i], b[i], c[i]) as builders.fma forms it for `target`."""
    m = spirv.Module()
    a, b, c = (m.storage_buffer(i, m.f32, readonly=True) for i in range(3))
    out = m.storage_buffer(3, m.f32)
    fn = m.compute_entry((WORKGROUP, 1, 1))
    i = fn.builtin(spirv.BuiltIn.GlobalInvocationId, 0)
    fn.buf_store(out, i, builders.fma(fn, target, fn.buf_load(a, i), fn.buf_load(b, i), fn.buf_load(c, i)))
    fn.end()
    return Kernel(f"fma_{target.fma_mode}", m.to_bytes(), (True, True, True, False), (WORKGROUP, 1, 1))


@pytest.mark.parametrize("mode", ["device", "f64"])
def test_fma_overflows_as_the_reference(device, mode):
    """Each case of the reference's overflow test (past the edge with addends of either sign, on the
    edge, just below it, random sums around 2^128) gives fma_f32's bits on the device."""
    target = device.target
    if mode == "f64":
        if not device.caps.shader_float64:
            pytest.skip("no float64 on this device")
        target = Target(target.subgroup_size, target.shuffle, "f64")
    elif target.fma_mode == "unfused":
        pytest.skip("this device has neither a fused Fma nor float64")
    a, b, c = overflow_cases()
    n = -(-a.size // WORKGROUP) * WORKGROUP
    bufs = [device.upload(np.resize(v, n)) for v in (a, b, c)] + [device.buffer(n * 4)]
    try:
        device.run([Dispatch(_fma_kernel(target), bufs, (n // WORKGROUP, 1, 1))])
        got = bufs[3].read(np.float32, n)[: a.size]
    finally:
        for buf in bufs:
            device.free(buf)
    want = numerics.fma_f32(a, b, c)
    differ = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert differ.size == 0, f"{differ.size} differ, first {differ[:4]}: {got[differ[:4]]} vs {want[differ[:4]]}"
