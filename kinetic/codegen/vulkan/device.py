"""One Vulkan device: instance (with the validation layer when asked), capabilities, buffers,
pipelines, and one command buffer of dispatches with the barriers their dependencies need.

Owns: `VulkanDevice` (talking to the driver through the `vulkan` package, cffi), collecting the
validation layer's messages (a debug-utils callback appends them to `VulkanDevice.messages`, so a
test can fail on any of them; synchronization validation is enabled through
VkValidationFeaturesEXT), and refusing work the device's limits forbid before the driver sees it
(`VulkanError`, `Unsupported`). Does not own: finding Vulkan and listing devices (loader.py), the
records a command buffer is made of and where its barriers go (dispatch.py), both re-exported here;
what kernels compute (the renderers in this package produce `Kernel`s) or which ops run here.

Buffers live in host-visible, coherent memory, mapped once: simple, and what lavapipe has anyway.
A discrete GPU would rather keep weights in device-local memory behind a staging copy (not done yet:
docs/devices.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kinetic.codegen.vulkan import spirv
from kinetic.codegen.vulkan.builders import Target
from kinetic.codegen.vulkan.capabilities import Capabilities, read_capabilities
from kinetic.codegen.vulkan.dispatch import DeviceBuffer, Dispatch, Kernel, barrier_points
from kinetic.codegen.vulkan.loader import (
    PhysicalDevice,
    VulkanUnavailable,
    load_vulkan,
    physical_devices,
    preferred_device,
)

# re-exported: the renderers, the runner, the registry and the tests import these from here
__all__ = ["DeviceBuffer", "Dispatch", "Kernel", "Message", "PhysicalDevice", "Unsupported", "VulkanDevice",
           "VulkanError", "VulkanUnavailable", "barrier_points", "load_vulkan", "physical_devices",
           "preferred_device"]

VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"


class VulkanError(RuntimeError):
    """Work the device cannot do (over a limit, missing a feature), refused before the driver sees it."""


class Unsupported(VulkanError):
    """An op, type or shape the Vulkan renderer has no kernel for: run it on another device."""


@dataclass(frozen=True)
class Message:
    severity: str  # "error", "warning", "info", "verbose"
    kind: str  # "general", "validation", "performance"
    id_name: str  # e.g. "SYNC-HAZARD-READ-AFTER-WRITE", "VUID-VkWriteDescriptorSet-descriptorType-00333"
    text: str


@dataclass
class _Pipeline:
    set_layout: object
    layout: object
    pipeline: object
    module: object


@dataclass
class _Collector:
    messages: list[Message] = field(default_factory=list)


_SEVERITY = {0x1: "verbose", 0x10: "info", 0x100: "warning", 0x1000: "error"}
_KINDS = {0x1: "general", 0x2: "validation", 0x4: "performance"}
_COLLECTORS: dict[int, _Collector] = {}  # the binding keeps one callback per process: route by user data


def _on_message(severity, kinds, data, user_data):
    vk = load_vulkan()
    collector = _COLLECTORS.get(int(vk.ffi.cast("uintptr_t", user_data)))
    if collector is not None:
        id_name = vk.ffi.string(data.pMessageIdName).decode() if data.pMessageIdName else ""
        kind = next((n for bit, n in _KINDS.items() if kinds & bit), "general")
        collector.messages.append(Message(_SEVERITY.get(severity, "error"), kind, id_name,
                                          vk.ffi.string(data.pMessage).decode(errors="replace")))
    return 0  # VK_FALSE: never abort the call


class VulkanDevice:
    """The first (or `index`-th) physical device, one compute queue, one command buffer per run."""

    def __init__(self, index: int = 0, validation: bool = False):
        self.vk = vk = load_vulkan()
        self.messages: list[Message] = []
        self._collector = _Collector(self.messages)
        self._messenger = None
        self._pipelines: dict[tuple, _Pipeline] = {}
        self._buffers: list[DeviceBuffer] = []
        self.validation = validation and self._has_layer(VALIDATION_LAYER)
        self.instance = self._create_instance()
        try:
            devices = vk.vkEnumeratePhysicalDevices(self.instance)
        except vk.VkError as e:
            raise VulkanUnavailable(f"the Vulkan loader found no usable driver ({type(e).__name__})") from e
        if len(devices) <= index:
            raise VulkanUnavailable(f"no Vulkan device {index}: the loader lists {len(devices)}")
        self.physical = devices[index]
        self.caps: Capabilities = read_capabilities(vk, self.physical)
        if self.caps.api_version < (1, 2, 0):
            raise VulkanUnavailable(f"{self.caps.device_name} supports Vulkan {self.caps.api_version}; "
                                    "Kinetic needs 1.2")
        self._create_device()
        self.fused_fma = self._probe_fused_fma()
        self.target = Target.of(self.caps, self.fused_fma)

    # ---- setup --------------------------------------------------------------------------------
    def _has_layer(self, name: str) -> bool:
        return any(layer.layerName == name for layer in self.vk.vkEnumerateInstanceLayerProperties())

    def _messenger_info(self):
        vk = self.vk
        key = id(self._collector)
        _COLLECTORS[key] = self._collector
        return vk.VkDebugUtilsMessengerCreateInfoEXT(
            messageSeverity=vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT
            | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
            messageType=vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT
            | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT
            | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
            pfnUserCallback=_on_message,
            pUserData=vk.ffi.cast("void *", key),
        )

    def _create_instance(self):
        vk = self.vk
        app = vk.VkApplicationInfo(pApplicationName="kinetic", pEngineName="kinetic",
                                   apiVersion=vk.VK_MAKE_VERSION(1, 3, 0))
        layers, extensions, chain = [], [], None
        if self.validation:
            layers, extensions = [VALIDATION_LAYER], [vk.VK_EXT_DEBUG_UTILS_EXTENSION_NAME]
            chain = vk.VkValidationFeaturesEXT(
                pNext=self._messenger_info(),  # also reports problems of instance creation itself
                enabledValidationFeatureCount=1,
                pEnabledValidationFeatures=[vk.VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT],
            )
        info = vk.VkInstanceCreateInfo(pNext=chain, pApplicationInfo=app, enabledLayerCount=len(layers),
                                       ppEnabledLayerNames=layers or None,
                                       enabledExtensionCount=len(extensions),
                                       ppEnabledExtensionNames=extensions or None)
        try:
            instance = vk.vkCreateInstance(info, None)
        except vk.VkError as e:
            raise VulkanUnavailable(f"vkCreateInstance failed ({type(e).__name__}): no Vulkan driver installed?") from e
        if self.validation:
            create = vk.vkGetInstanceProcAddr(instance, "vkCreateDebugUtilsMessengerEXT")
            self._messenger = create(instance, self._messenger_info(), None)
        return instance

    def _create_device(self):
        vk, caps = self.vk, self.caps
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
        compute = [i for i, f in enumerate(families) if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT]
        if not compute:
            raise VulkanUnavailable(f"{caps.device_name} has no compute queue")
        self.queue_family = compute[0]
        # enable every feature a kernel may use that the device has (using one not enabled is an error)
        v11 = vk.VkPhysicalDeviceVulkan11Features(storageBuffer16BitAccess=caps.storage_buffer_16bit)
        v12 = vk.VkPhysicalDeviceVulkan12Features(pNext=v11, shaderFloat16=caps.shader_float16,
                                                  shaderInt8=caps.shader_int8,
                                                  storageBuffer8BitAccess=caps.storage_buffer_8bit)
        head = v12
        if caps.api_version >= (1, 3, 0):
            head = vk.VkPhysicalDeviceVulkan13Features(pNext=v12, subgroupSizeControl=caps.full_subgroups,
                                                       computeFullSubgroups=caps.full_subgroups)
        core = vk.VkPhysicalDeviceFeatures(shaderFloat64=caps.shader_float64, shaderInt16=caps.shader_int16,
                                           shaderInt64=caps.shader_int64)
        queue = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.queue_family, queueCount=1, pQueuePriorities=[1.0])
        info = vk.VkDeviceCreateInfo(pNext=vk.VkPhysicalDeviceFeatures2(pNext=head, features=core),
                                     queueCreateInfoCount=1, pQueueCreateInfos=[queue])
        self.device = vk.vkCreateDevice(self.physical, info, None)
        self.queue = vk.vkGetDeviceQueue(self.device, self.queue_family, 0)
        self.command_pool = vk.vkCreateCommandPool(self.device, vk.VkCommandPoolCreateInfo(
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=self.queue_family), None)
        self.command_buffer = vk.vkAllocateCommandBuffers(self.device, vk.VkCommandBufferAllocateInfo(
            commandPool=self.command_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        self.fence = vk.vkCreateFence(self.device, vk.VkFenceCreateInfo(), None)
        memory = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        want = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        self._host_types = [i for i in range(memory.memoryTypeCount)
                            if memory.memoryTypes[i].propertyFlags & want == want]

    # ---- buffers ------------------------------------------------------------------------------
    def buffer(self, nbytes: int) -> DeviceBuffer:
        """A storage buffer of at least nbytes (rounded up to 16), mapped for the host."""
        vk = self.vk
        size = max(16, -(-int(nbytes) // 16) * 16)
        usage = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
                 | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
        handle = vk.vkCreateBuffer(self.device, vk.VkBufferCreateInfo(
            size=size, usage=usage, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        req = vk.vkGetBufferMemoryRequirements(self.device, handle)
        types = [t for t in self._host_types if req.memoryTypeBits & (1 << t)]
        if not types:
            raise VulkanError(f"{self.caps.device_name} has no host-visible memory for a storage buffer")
        memory = vk.vkAllocateMemory(self.device, vk.VkMemoryAllocateInfo(
            allocationSize=req.size, memoryTypeIndex=types[0]), None)
        vk.vkBindBufferMemory(self.device, handle, memory, 0)
        buf = DeviceBuffer(handle, memory, size, vk.vkMapMemory(self.device, memory, 0, size, 0))
        self._buffers.append(buf)
        return buf

    def upload(self, array: np.ndarray) -> DeviceBuffer:
        array = np.ascontiguousarray(array)
        buf = self.buffer(array.nbytes)
        buf.write(array)
        return buf

    def free(self, buf: DeviceBuffer) -> None:
        vk = self.vk
        vk.vkUnmapMemory(self.device, buf.memory)
        vk.vkDestroyBuffer(self.device, buf.handle, None)
        vk.vkFreeMemory(self.device, buf.memory, None)
        self._buffers.remove(buf)

    # ---- pipelines ----------------------------------------------------------------------------
    def check(self, kernel: Kernel) -> None:
        """Refuse a kernel the device cannot run, with the reason."""
        caps, lx = self.caps, kernel.local_size
        too_wide = any(a > b for a, b in zip(lx, caps.max_workgroup_size, strict=True))
        if lx[0] * lx[1] * lx[2] > caps.max_workgroup_invocations or too_wide:
            raise VulkanError(f"{kernel.name}: workgroup {lx} exceeds the device's {caps.max_workgroup_size} / "
                              f"{caps.max_workgroup_invocations} invocations")
        if kernel.push_size > caps.max_push_constants:
            raise VulkanError(f"{kernel.name}: {kernel.push_size} bytes of push constants, the device allows "
                              f"{caps.max_push_constants}")

    def pipeline(self, kernel: Kernel) -> _Pipeline:
        full = kernel.full_subgroups and self.caps.full_subgroups
        key = (kernel.key, len(kernel.readonly), kernel.push_size, full)
        if key in self._pipelines:
            return self._pipelines[key]
        self.check(kernel)
        vk = self.vk
        bindings = [vk.VkDescriptorSetLayoutBinding(binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                    descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                    for i in range(len(kernel.readonly))]
        set_layout = vk.vkCreateDescriptorSetLayout(self.device, vk.VkDescriptorSetLayoutCreateInfo(
            bindingCount=len(bindings), pBindings=bindings), None)
        ranges = [vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=kernel.push_size)]
        layout = vk.vkCreatePipelineLayout(self.device, vk.VkPipelineLayoutCreateInfo(
            setLayoutCount=1, pSetLayouts=[set_layout], pushConstantRangeCount=1 if kernel.push_size else 0,
            pPushConstantRanges=ranges if kernel.push_size else None), None)
        module = vk.vkCreateShaderModule(self.device, vk.VkShaderModuleCreateInfo(
            codeSize=len(kernel.spirv), pCode=kernel.spirv), None)
        flags = vk.VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT_EXT if full else 0
        stage = vk.VkPipelineShaderStageCreateInfo(flags=flags, stage=vk.VK_SHADER_STAGE_COMPUTE_BIT,
                                                   module=module, pName="main")
        pipeline = vk.vkCreateComputePipelines(self.device, None, 1, [vk.VkComputePipelineCreateInfo(
            stage=stage, layout=layout)], None)[0]
        self._pipelines[key] = _Pipeline(set_layout, layout, pipeline, module)
        return self._pipelines[key]

    # ---- running ------------------------------------------------------------------------------
    def run(self, dispatches: Sequence[Dispatch], barriers: bool = True, check_limits: bool = True) -> None:
        """Record the dispatches into one command buffer, in order, with a compute-to-compute barrier
        before each dispatch that reads or writes a buffer an earlier one wrote (or writes one an
        earlier one read), and a compute-to-host barrier at the end; submit and wait.
        `barriers=False` and `check_limits=False` exist only for the tests that plant errors to
        prove the validation layer reports them."""
        vk = self.vk
        pipes = [self.pipeline(d.kernel) for d in dispatches]
        if check_limits:
            for d in dispatches:
                self._check_dispatch(d)
        pool = vk.vkCreateDescriptorPool(self.device, vk.VkDescriptorPoolCreateInfo(
            maxSets=len(dispatches), poolSizeCount=1, pPoolSizes=[vk.VkDescriptorPoolSize(
                type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                descriptorCount=max(1, sum(len(d.buffers) for d in dispatches)))]), None)
        try:
            sets = [self._descriptor_set(pool, p, d) for p, d in zip(pipes, dispatches, strict=True)]
            cb = self.command_buffer
            vk.vkResetCommandBuffer(cb, 0)
            vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(
                flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
            before = barrier_points(dispatches) if barriers else [False] * len(dispatches)
            for pipe, dset, d, barrier in zip(pipes, sets, dispatches, before, strict=True):
                if barrier:
                    self._barrier(cb, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                                  vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT)
                vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipe.pipeline)
                vk.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipe.layout, 0, 1, [dset], 0, None)
                if d.kernel.push_size:
                    data = vk.ffi.new("char[]", d.push.ljust(d.kernel.push_size, b"\0"))
                    vk.vkCmdPushConstants(cb, pipe.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, d.kernel.push_size, data)
                vk.vkCmdDispatch(cb, *d.groups)
            self._barrier(cb, vk.VK_PIPELINE_STAGE_HOST_BIT, vk.VK_ACCESS_HOST_READ_BIT)
            vk.vkEndCommandBuffer(cb)
            vk.vkResetFences(self.device, 1, [self.fence])
            vk.vkQueueSubmit(self.queue, 1, [vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cb])], self.fence)
            vk.vkWaitForFences(self.device, 1, [self.fence], vk.VK_TRUE, 0xFFFFFFFFFFFFFFFF)
        finally:
            vk.vkDestroyDescriptorPool(self.device, pool, None)

    def _check_dispatch(self, d: Dispatch) -> None:
        caps = self.caps
        if len(d.buffers) != len(d.kernel.readonly):
            raise VulkanError(f"{d.kernel.name} takes {len(d.kernel.readonly)} buffers, got {len(d.buffers)}")
        for i, b in enumerate(d.buffers):
            if b.size > caps.max_storage_buffer_range:
                raise VulkanError(f"{d.kernel.name}: binding {i} is {b.size} bytes, over the device's "
                                  f"maxStorageBufferRange of {caps.max_storage_buffer_range}")
        if any(g > m for g, m in zip(d.groups, caps.max_workgroup_count, strict=True)):
            raise VulkanError(f"{d.kernel.name}: {d.groups} workgroups exceed {caps.max_workgroup_count}")

    def _descriptor_set(self, pool, pipe: _Pipeline, d: Dispatch):
        vk = self.vk
        dset = vk.vkAllocateDescriptorSets(self.device, vk.VkDescriptorSetAllocateInfo(
            descriptorPool=pool, descriptorSetCount=1, pSetLayouts=[pipe.set_layout]))[0]
        writes = [vk.VkWriteDescriptorSet(
            dstSet=dset, dstBinding=i, descriptorCount=1, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=b.handle, offset=0, range=b.size)])
            for i, b in enumerate(d.buffers)]
        vk.vkUpdateDescriptorSets(self.device, len(writes), writes, 0, None)
        return dset

    def _barrier(self, cb, dst_stage: int, dst_access: int) -> None:
        vk = self.vk
        barrier = vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT, dstAccessMask=dst_access)
        vk.vkCmdPipelineBarrier(cb, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, dst_stage, 0, 1, [barrier],
                                0, None, 0, None)

    def _probe_fused_fma(self) -> bool:
        """Whether the device's Fma rounds once: Vulkan allows it to be a multiply and an add
        (lavapipe's is). fma(x, x, -(x*x)) is the rounding error of x*x when fused, 0 when not."""
        m = spirv.Module()
        src = m.storage_buffer(0, m.f32, readonly=True)
        dst = m.storage_buffer(1, m.f32)
        fn = m.compute_entry((1, 1, 1))
        for i in range(4):
            x = fn.buf_load(src, m.u(i))
            fn.buf_store(dst, m.u(i), fn.fma(x, x, fn.fneg(fn.fmul(x, x))))
        fn.end()
        values = np.array([1 + 2.0**-12, 1 + 3 * 2.0**-13, 3.1, 0.1], np.float32)
        inp, out = self.upload(values), self.buffer(16)
        try:
            self.run([Dispatch(Kernel("probe_fma", m.to_bytes(), (True, False), (1, 1, 1)), [inp, out], (1, 1, 1))])
            got = out.read(np.float32, 4)
        finally:
            self.free(inp)
            self.free(out)
        x64 = values.astype(np.float64)
        exact = (x64 * x64 - (values * values).astype(np.float64)).astype(np.float32)
        return bool(np.array_equal(got, exact))

    # ---- teardown -----------------------------------------------------------------------------
    def close(self) -> None:
        vk = self.vk
        if getattr(self, "device", None) is None:
            return
        vk.vkDeviceWaitIdle(self.device)
        for buf in list(self._buffers):
            self.free(buf)
        for p in self._pipelines.values():
            vk.vkDestroyPipeline(self.device, p.pipeline, None)
            vk.vkDestroyPipelineLayout(self.device, p.layout, None)
            vk.vkDestroyDescriptorSetLayout(self.device, p.set_layout, None)
            vk.vkDestroyShaderModule(self.device, p.module, None)
        self._pipelines.clear()
        vk.vkDestroyFence(self.device, self.fence, None)
        vk.vkDestroyCommandPool(self.device, self.command_pool, None)
        vk.vkDestroyDevice(self.device, None)
        self.device = None
        if self._messenger is not None:
            destroy = vk.vkGetInstanceProcAddr(self.instance, "vkDestroyDebugUtilsMessengerEXT")
            destroy(self.instance, self._messenger, None)
        vk.vkDestroyInstance(self.instance, None)
        _COLLECTORS.pop(id(self._collector), None)

    def __enter__(self) -> VulkanDevice:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
