"""What a Vulkan device can do, read from the device itself: the renderer's capabilities as data.

Owns: `Capabilities` (subgroup size and operations, workgroup limits, binding and heap sizes, the
float16 / int8 / 8- and 16-bit storage features, the device type) and `read_capabilities`, which
fills it from `vkGetPhysicalDeviceProperties2` / `Features2` / `MemoryProperties`. Nothing here is
hard-coded per vendor; a kernel renderer asks this record and refuses what the device lacks.
Does not own: creating devices (device.py) or choosing kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

DEVICE_TYPES = {0: "other", 1: "integrated", 2: "discrete", 3: "virtual", 4: "cpu"}

# VkSubgroupFeatureFlagBits, in bit order
SUBGROUP_OPS = ("basic", "vote", "arithmetic", "ballot", "shuffle", "shuffle_relative", "clustered", "quad")


def _version(v: int) -> tuple[int, int, int]:
    return (v >> 22) & 0x7F, (v >> 12) & 0x3FF, v & 0xFFF


@dataclass(frozen=True)
class Capabilities:
    device_name: str
    device_type: str  # "discrete", "integrated", "virtual", "cpu" (lavapipe/llvmpipe, SwiftShader), "other"
    vendor_id: int
    api_version: tuple[int, int, int]
    driver_version: int
    subgroup_size: int
    subgroup_ops: frozenset[str]  # of SUBGROUP_OPS usable in compute shaders
    subgroup_size_range: tuple[int, int]  # (min, max) with subgroup size control, else (size, size)
    full_subgroups: bool  # computeFullSubgroups: a pipeline may require full subgroups
    max_workgroup_size: tuple[int, int, int]
    max_workgroup_invocations: int
    max_workgroup_count: tuple[int, int, int]
    max_shared_memory: int
    max_storage_buffer_range: int
    max_push_constants: int
    min_storage_buffer_offset_alignment: int
    max_memory_allocation: int
    heap_sizes: tuple[int, ...]
    shader_float16: bool
    shader_float64: bool
    shader_int8: bool
    shader_int16: bool
    shader_int64: bool
    storage_buffer_8bit: bool
    storage_buffer_16bit: bool

    @property
    def is_cpu(self) -> bool:
        """A CPU implementation of Vulkan (Mesa's lavapipe): correct, but no faster than the CPU path."""
        return self.device_type == "cpu"

    def has_subgroup(self, *ops: str) -> bool:
        return all(op in self.subgroup_ops for op in ops)

    def describe(self) -> str:
        major, minor, patch = self.api_version
        return (f"{self.device_name} ({self.device_type}, Vulkan {major}.{minor}.{patch}, "
                f"subgroup {self.subgroup_size}, max binding {self.max_storage_buffer_range >> 20} MiB)")


def read_capabilities(vk, physical_device) -> Capabilities:
    """Query one physical device through the `vulkan` binding module `vk`."""
    props = vk.vkGetPhysicalDeviceProperties(physical_device)
    api = _version(props.apiVersion)
    size_control = vk.VkPhysicalDeviceSubgroupSizeControlProperties()
    subgroup = vk.VkPhysicalDeviceSubgroupProperties(pNext=size_control if api >= (1, 3, 0) else None)
    vk.vkGetPhysicalDeviceProperties2(physical_device, vk.VkPhysicalDeviceProperties2(pNext=subgroup))

    v11 = vk.VkPhysicalDeviceVulkan11Features()
    v12 = vk.VkPhysicalDeviceVulkan12Features(pNext=v11)
    v13 = vk.VkPhysicalDeviceVulkan13Features(pNext=v12)
    head = v13 if api >= (1, 3, 0) else v12 if api >= (1, 2, 0) else None
    features2 = vk.VkPhysicalDeviceFeatures2(pNext=head)
    vk.vkGetPhysicalDeviceFeatures2(physical_device, features2)
    core = features2.features
    newer = api >= (1, 2, 0)

    ops = frozenset(name for bit, name in enumerate(SUBGROUP_OPS) if subgroup.supportedOperations & (1 << bit))
    compute = bool(subgroup.supportedStages & vk.VK_SHADER_STAGE_COMPUTE_BIT)
    size_range = (subgroup.subgroupSize, subgroup.subgroupSize)
    full = False
    if api >= (1, 3, 0) and v13.subgroupSizeControl:
        size_range = (size_control.minSubgroupSize, size_control.maxSubgroupSize)
        full = bool(v13.computeFullSubgroups)
    limits = props.limits
    memory = vk.vkGetPhysicalDeviceMemoryProperties(physical_device)
    heaps = tuple(int(memory.memoryHeaps[i].size) for i in range(memory.memoryHeapCount))
    maint3 = vk.VkPhysicalDeviceMaintenance3Properties()
    vk.vkGetPhysicalDeviceProperties2(physical_device, vk.VkPhysicalDeviceProperties2(pNext=maint3))
    return Capabilities(
        device_name=props.deviceName,
        device_type=DEVICE_TYPES.get(props.deviceType, "other"),
        vendor_id=props.vendorID,
        api_version=api,
        driver_version=props.driverVersion,
        subgroup_size=subgroup.subgroupSize,
        subgroup_ops=ops if compute else frozenset(),
        subgroup_size_range=size_range,
        full_subgroups=full,
        max_workgroup_size=tuple(limits.maxComputeWorkGroupSize),
        max_workgroup_invocations=limits.maxComputeWorkGroupInvocations,
        max_workgroup_count=tuple(limits.maxComputeWorkGroupCount),
        max_shared_memory=limits.maxComputeSharedMemorySize,
        max_storage_buffer_range=limits.maxStorageBufferRange,
        max_push_constants=limits.maxPushConstantsSize,
        min_storage_buffer_offset_alignment=limits.minStorageBufferOffsetAlignment,
        max_memory_allocation=int(maint3.maxMemoryAllocationSize),
        heap_sizes=heaps,
        shader_float16=bool(newer and v12.shaderFloat16),
        shader_float64=bool(core.shaderFloat64),
        shader_int8=bool(newer and v12.shaderInt8),
        shader_int16=bool(core.shaderInt16),
        shader_int64=bool(core.shaderInt64),
        storage_buffer_8bit=bool(newer and v12.storageBuffer8BitAccess),
        storage_buffer_16bit=bool(newer and v11.storageBuffer16BitAccess),
    )
