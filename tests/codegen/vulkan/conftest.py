"""Fixtures for the Vulkan tests: one validated device per session (Mesa's lavapipe unless the caller
chose a driver), `spirv-val`, and a check after every test that the validation layer said nothing.

The environment is set here, not globally: VK_ICD_FILENAMES points the loader at lavapipe's ICD
(unless already set, so a GPU machine can run the same tests on its own driver) and Mesa's shader
cache is off, so no test reads or writes ~/.cache/mesa_shader_cache. Every test that needs the device
skips with the reason when the `vulkan` package, the loader or a device is missing.
"""

from __future__ import annotations

import glob
import os

import pytest

LAVAPIPE_ICDS = "/usr/share/vulkan/icd.d/lvp_icd.*.json"


@pytest.fixture(scope="session")
def vulkan_device():
    """The session's VulkanDevice with the validation layer (and synchronization validation) on."""
    from kinetic.codegen.vulkan.device import VulkanDevice, VulkanUnavailable

    with pytest.MonkeyPatch.context() as mp:  # the loader reads these when the instance is created
        icds = sorted(glob.glob(LAVAPIPE_ICDS))
        if icds and "VK_ICD_FILENAMES" not in os.environ:
            mp.setenv("VK_ICD_FILENAMES", ":".join(icds))
        mp.setenv("MESA_SHADER_CACHE_DISABLE", "true")
        try:
            device = VulkanDevice(validation=True)
        except VulkanUnavailable as e:
            pytest.skip(f"no Vulkan: {e}")
    try:
        yield device
    finally:
        device.close()


@pytest.fixture
def device(vulkan_device):
    """The session device; fails the test if the validation layer reported anything during it."""
    vulkan_device.messages.clear()
    yield vulkan_device
    found = [f"{m.severity} {m.id_name}: {m.text[:300]}" for m in vulkan_device.messages]
    vulkan_device.messages.clear()
    assert not found, "validation layer messages:\n" + "\n".join(found)


@pytest.fixture
def ops(device):
    from kinetic.codegen.vulkan.ops import VulkanOps

    return VulkanOps(device)
