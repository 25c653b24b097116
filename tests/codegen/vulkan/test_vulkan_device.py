"""The Vulkan device layer: capabilities are read from the device, lavapipe is known as a CPU, the
validation layer's messages are collected (and planted errors are caught), limits are refused
before the driver sees them."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from kinetic.codegen.vulkan import elementwise, spirv
from kinetic.codegen.vulkan.device import Dispatch, Kernel, VulkanError


def _builtin_kernel() -> Kernel:
    """Writes SubgroupSize and NumSubgroups as the shader sees them."""
    m = spirv.Module()
    out = m.storage_buffer(0, m.u32)
    fn = m.compute_entry((64, 1, 1))
    with fn.if_(fn.icmp(spirv.Op.IEqual, fn.builtin(spirv.BuiltIn.LocalInvocationIndex), m.u(0))):
        fn.buf_store(out, m.u(0), fn.builtin(spirv.BuiltIn.SubgroupSize))
        fn.buf_store(out, m.u(1), fn.builtin(spirv.BuiltIn.NumSubgroups))
    fn.end()
    return Kernel("subgroup_builtins", m.to_bytes(), (False,), (64, 1, 1), full_subgroups=True)


def test_capabilities_are_the_devices_own(device):
    """The subgroup size in the capabilities is the one shaders see, and the limits are the ones
    vkGetPhysicalDeviceProperties reports (read, not assumed)."""
    out = device.buffer(16)
    device.run([Dispatch(_builtin_kernel(), [out], (1, 1, 1))])
    size, count = out.read(np.uint32, 2)
    device.free(out)
    caps = device.caps
    assert size == caps.subgroup_size and count == 64 // caps.subgroup_size
    limits = device.vk.vkGetPhysicalDeviceProperties(device.physical).limits
    assert caps.max_storage_buffer_range == limits.maxStorageBufferRange
    assert caps.max_workgroup_invocations == limits.maxComputeWorkGroupInvocations
    assert caps.heap_sizes and all(h > 0 for h in caps.heap_sizes)
    assert caps.subgroup_size_range[0] <= caps.subgroup_size <= caps.subgroup_size_range[1]


def test_a_cpu_device_is_identified(device):
    """A CPU implementation (lavapipe's llvmpipe) reports the CPU device type and says so."""
    caps = device.caps
    if "llvmpipe" not in caps.device_name:
        pytest.skip(f"not lavapipe: {caps.device_name}")
    assert caps.is_cpu and caps.device_type == "cpu" and "cpu" in caps.describe()


def test_fma_probe_matches_a_direct_measurement(device):
    """`fused_fma` says whether Fma rounds once; the renderers' fma is exact either way (the f64 path
    where it does not), so fma(x, x, -(x*x)) gives x*x's rounding error."""
    from kinetic.codegen.vulkan import builders

    m = spirv.Module()
    src, dst = m.storage_buffer(0, m.f32, readonly=True), m.storage_buffer(1, m.f32)
    fn = m.compute_entry((64, 1, 1))
    i = fn.builtin(spirv.BuiltIn.GlobalInvocationId, 0)
    x = fn.buf_load(src, i)
    fn.buf_store(dst, i, builders.fma(fn, device.target, x, x, fn.fneg(fn.fmul(x, x))))
    fn.end()
    if device.target.fma_mode == "unfused":
        pytest.skip("this device has neither a fused Fma nor float64")
    x = np.random.default_rng(1).standard_normal(64).astype(np.float32)
    bufs = [device.upload(x), device.buffer(256)]
    device.run([Dispatch(Kernel("fma_check", m.to_bytes(), (True, False), (64, 1, 1)), bufs, (1, 1, 1))])
    got = bufs[1].read(np.float32, 64)
    for b in bufs:
        device.free(b)
    x64 = x.astype(np.float64)
    np.testing.assert_array_equal(got, (x64 * x64 - (x * x).astype(np.float64)).astype(np.float32))
    assert got.any()


def _add_chain(device):
    k = elementwise.render_elementwise(device.target, "add")
    a, b = device.upload(np.ones(1024, np.float32)), device.upload(np.full(1024, 2, np.float32))
    c, d = device.buffer(4096), device.buffer(4096)
    push = struct.pack("<I", 1024)
    return k, [a, b, c, d], [Dispatch(k, [a, b, c], (4, 1, 1), push), Dispatch(k, [c, b, d], (4, 1, 1), push)]


def test_dependent_dispatches_get_their_barrier(device):
    """c = a + b, then d = c + b in one command buffer: right answer, and synchronization
    validation finds no hazard (the device fixture fails the test on any message)."""
    _, bufs, dispatches = _add_chain(device)
    device.run(dispatches)
    np.testing.assert_array_equal(bufs[3].read(np.float32, 1024), np.full(1024, 5, np.float32))
    for b in bufs:
        device.free(b)


def test_a_missing_barrier_is_caught(vulkan_device):
    """Planted error: the same two dependent dispatches without the barrier; the validation layer's
    synchronization check reports a read-after-write hazard through the collector."""
    if not vulkan_device.validation:
        pytest.skip("the Khronos validation layer is not installed (apt install vulkan-validationlayers)")
    vulkan_device.messages.clear()
    _, bufs, dispatches = _add_chain(vulkan_device)
    vulkan_device.run(dispatches, barriers=False)
    found = {m.id_name for m in vulkan_device.messages if m.severity == "error"}
    vulkan_device.messages.clear()
    for b in bufs:
        vulkan_device.free(b)
    assert "SYNC-HAZARD-READ-AFTER-WRITE" in found


def test_an_oversized_binding_is_refused_and_would_be_caught(vulkan_device):
    """A binding larger than maxStorageBufferRange is refused with the reason; planted past the
    check, the validation layer reports it (lavapipe itself would silently accept it)."""
    if not vulkan_device.validation:
        pytest.skip("the Khronos validation layer is not installed (apt install vulkan-validationlayers)")
    vulkan_device.messages.clear()
    k = elementwise.render_elementwise(vulkan_device.target, "add")
    limit = vulkan_device.caps.max_storage_buffer_range
    small = [vulkan_device.upload(np.ones(64, np.float32)) for _ in range(2)]
    big = vulkan_device.buffer(limit + 16)
    dispatch = Dispatch(k, [*small, big], (1, 1, 1), struct.pack("<I", 64))
    try:
        with pytest.raises(VulkanError, match="maxStorageBufferRange"):
            vulkan_device.run([dispatch])
        vulkan_device.run([dispatch], check_limits=False)
        found = {m.id_name for m in vulkan_device.messages if m.severity == "error"}
    finally:
        vulkan_device.messages.clear()
        for b in [*small, big]:
            vulkan_device.free(b)
    assert "VUID-VkWriteDescriptorSet-descriptorType-00333" in found


def test_invalid_spirv_is_caught(vulkan_device):
    """Planted error: a module whose store writes a read-only (NonWritable) buffer; the validation
    layer (which runs spirv-val's rules on every shader module) reports it."""
    if not vulkan_device.validation:
        pytest.skip("the Khronos validation layer is not installed (apt install vulkan-validationlayers)")
    vulkan_device.messages.clear()
    m = spirv.Module()
    buf = m.storage_buffer(0, m.f32)
    fn = m.compute_entry((1, 1, 1))
    fn.buf_store(buf, m.u(0), m.u(1))  # a u32 stored through an f32 pointer: invalid
    fn.end()
    try:
        vulkan_device.pipeline(Kernel("invalid", m.to_bytes(), (False,), (1, 1, 1)))
    except Exception:  # the driver may refuse it too; what matters is the report
        pass
    found = [msg for msg in vulkan_device.messages if msg.severity == "error"]
    vulkan_device.messages.clear()
    assert found


def test_auto_skips_a_cpu_type_vulkan_device(monkeypatch):
    """`--device auto` never picks a CPU-type Vulkan device (lavapipe): it names it in its skip line
    and falls through to the CPU; a GPU listed after it is the one --device vulkan and auto use."""
    from kinetic import devices
    from kinetic.codegen.cuda import device as cuda_device
    from kinetic.codegen.vulkan import device as vk_device
    from kinetic.codegen.vulkan.device import PhysicalDevice, preferred_device

    lavapipe = PhysicalDevice(0, "llvmpipe (LLVM 15.0.6, 256 bits)", "cpu", (1, 3, 230))
    gpu = PhysicalDevice(1, "AMD Radeon", "discrete", (1, 3, 260))
    old = PhysicalDevice(2, "Old GPU", "integrated", (1, 1, 0))
    assert preferred_device([lavapipe, gpu]) == gpu and preferred_device([old, lavapipe]) == lavapipe
    monkeypatch.setattr(cuda_device, "unavailable_reason", lambda: "no NVIDIA driver here")
    for listed, want in (([lavapipe], "cpu"), ([lavapipe, gpu], "vulkan"), ([old], "cpu")):
        monkeypatch.setattr(vk_device, "physical_devices", lambda listed=listed: listed)
        lines: list[str] = []
        assert devices.resolve_device("auto", lines.append) == want
        assert lines[0] == "auto: skipping CUDA: no NVIDIA driver here"
        assert len(lines) == (1 if want == "vulkan" else 2)
        if listed == [lavapipe]:
            assert lines[1] == ("auto: skipping Vulkan device llvmpipe (LLVM 15.0.6, 256 bits): a CPU-type device "
                                "(lavapipe; --device cpu is faster)")
    assert devices.resolve_device("cpu", lines.append) == "cpu"
