"""Finding Vulkan: the binding module and the devices the loader lists, before any is opened.

Owns: `VulkanUnavailable` (no usable Vulkan here, and why), `load_vulkan` (the `vulkan` package,
imported only when asked), `PhysicalDevice`, `physical_devices` (creates and destroys an instance,
opens no device) and `preferred_device` (the one `--device vulkan` opens). Does not own opening a
device or its capabilities (device.py, capabilities.py); kinetic/devices.py reads these through
device.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from kinetic.codegen.vulkan.capabilities import DEVICE_TYPES, _version


class VulkanUnavailable(RuntimeError):
    """No usable Vulkan here; the message says why (package, loader, device)."""


def load_vulkan():
    """The `vulkan` binding module, or VulkanUnavailable saying what is missing."""
    try:
        import vulkan
    except ImportError as e:
        raise VulkanUnavailable("the `vulkan` Python package is not installed "
                                "(pip install 'kinetic-engine[vulkan]')") from e
    except OSError as e:  # the package dlopens libvulkan.so.1 at import
        raise VulkanUnavailable(f"no Vulkan loader (libvulkan.so.1; apt install libvulkan1): {e}") from e
    return vulkan


@dataclass(frozen=True)
class PhysicalDevice:
    """A device the loader lists, before anything is created on it."""

    index: int
    name: str
    type: str  # as Capabilities.device_type: "discrete", "integrated", "virtual", "cpu", "other"
    api_version: tuple[int, int, int]
    device_memory: int | None = None  # bytes of its device-local memory heaps (kinetic doctor, fit)

    @property
    def is_cpu(self) -> bool:
        return self.type == "cpu"


def physical_devices() -> list[PhysicalDevice]:
    """The Vulkan devices the loader lists, in its order (an instance is created and destroyed; no
    device is opened). VulkanUnavailable when the package, the loader or a driver is missing."""
    vk = load_vulkan()
    app = vk.VkApplicationInfo(pApplicationName="kinetic", pEngineName="kinetic",
                               apiVersion=vk.VK_MAKE_VERSION(1, 3, 0))
    try:
        instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=app), None)
    except vk.VkError as e:
        raise VulkanUnavailable(f"vkCreateInstance failed ({type(e).__name__}): no Vulkan driver installed?") from e
    try:
        try:
            handles = vk.vkEnumeratePhysicalDevices(instance)
        except vk.VkError as e:
            raise VulkanUnavailable(f"the Vulkan loader found no usable driver ({type(e).__name__})") from e
        found = []
        for i, handle in enumerate(handles):
            props = vk.vkGetPhysicalDeviceProperties(handle)
            found.append(PhysicalDevice(i, props.deviceName, DEVICE_TYPES.get(props.deviceType, "other"),
                                        _version(props.apiVersion), _device_local_bytes(vk, handle)))
        return found
    finally:
        vk.vkDestroyInstance(instance, None)


def _device_local_bytes(vk, handle) -> int:
    heaps = vk.vkGetPhysicalDeviceMemoryProperties(handle)
    return sum(heaps.memoryHeaps[i].size for i in range(heaps.memoryHeapCount)
               if heaps.memoryHeaps[i].flags & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)


def preferred_device(devices: list[PhysicalDevice]) -> PhysicalDevice | None:
    """The device `--device vulkan` runs on: the first GPU (any non-CPU type) with Vulkan 1.2, else the
    first device with Vulkan 1.2 (lavapipe), else None."""
    usable = [d for d in devices if d.api_version >= (1, 2, 0)]
    return next((d for d in usable if not d.is_cpu), usable[0] if usable else None)
