"""What this machine offers to run models on: the CPU and its features, memory, GPUs, disk.

Owns: collecting those facts into plain records for `kinetic doctor`, `kinetic fit` and the
quantization `kinetic pull` chooses (`Machine.probe()`), and the memory a plan may use
(`Machine.plan_memory`). Every fact comes from code that already owns it: the CPU's features from
the CPU renderer's host probe (llvmlite), whether a GPU can run from the device registry's
`unavailable()` reasons, CUDA's devices from CuPy, Vulkan's from the Vulkan loader module, memory
from /proc/meminfo. Does not own running anything, or what to do about a problem (the doctor).

Tests build a Machine directly with the figures they need; nothing here is global state.
"""

from __future__ import annotations

import os
import platform
import shutil
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Cpu:
    name: str
    threads: int  # logical CPUs this process may run on
    features: dict[str, bool]  # AVX2, FMA, F16C, AVX-512, VNNI
    kernels: str  # the int8 dot variant the generated kernels use here (vnni, avx2, generic)


@dataclass(frozen=True)
class Gpu:
    api: str  # "CUDA" or "Vulkan"
    name: str
    free: int | None  # bytes free now (CUDA), None when the API does not say
    total: int | None  # bytes of device memory
    detail: str  # driver and versions, in words
    cpu_type: bool = False  # a CPU-type Vulkan device (lavapipe): not a GPU to plan for


@dataclass(frozen=True)
class Machine:
    cpu: Cpu | None
    memory_total: int | None
    memory_available: int | None
    gpus: tuple[Gpu, ...] = ()
    gpu_problems: dict[str, str] = field(default_factory=dict)  # "CUDA"/"Vulkan" -> why unusable

    @classmethod
    def probe(cls) -> Machine:
        total, available = memory()
        cuda, cuda_problem = cuda_gpus()
        vulkan, vulkan_problem = vulkan_gpus()
        problems = {api: why for api, why in (("CUDA", cuda_problem), ("Vulkan", vulkan_problem)) if why}
        return cls(cpu_facts(), total, available, tuple(cuda + vulkan), problems)

    @property
    def plan_gpu(self) -> Gpu | None:
        """The GPU a plan puts layers on: the first CUDA GPU with a free-memory figure, else the
        first real Vulkan GPU whose memory is known."""
        for gpu in self.gpus:
            if not gpu.cpu_type and (gpu.free or gpu.total):
                return gpu
        return None

    def plan_memory(self) -> tuple[int | None, str]:
        """(bytes a model may take, what that figure is): the plan GPU's free memory, else half the
        available RAM (the rest stays for the system and other programs)."""
        gpu = self.plan_gpu
        if gpu is not None:
            return gpu.free or gpu.total, f"the free memory of {gpu.name}"
        if self.memory_available is None:
            return None, "memory that this system does not report"
        return self.memory_available // 2, "half the available memory"


def memory() -> tuple[int | None, int | None]:
    """(total, available) bytes of RAM, from /proc/meminfo (sysconf elsewhere); None when unknown."""
    fields: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                fields[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    total = fields.get("MemTotal") or _sysconf("SC_PHYS_PAGES")
    available = fields.get("MemAvailable") or _sysconf("SC_AVPHYS_PAGES")
    return total, available


def _sysconf(pages: str) -> int | None:
    try:
        return os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def cpu_facts() -> Cpu | None:
    from kinetic.codegen.cpu.target import host
    from kinetic.limits import cpus

    try:
        h = host()
    except Exception:  # llvmlite fails to start: the CPU path cannot compile; the doctor says so
        return None
    flags = h.flags
    features = {"AVX2": "avx2" in flags, "FMA": "fma" in flags, "F16C": "f16c" in flags,
                "AVX-512": "avx512f" in flags, "VNNI": "avx512vnni" in flags or "avxvnni" in flags}
    return Cpu(_cpu_name() or h.cpu, cpus(), features, h.best_variant())


def _cpu_name() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or None


def cuda_gpus() -> tuple[list[Gpu], str | None]:
    """The CUDA GPUs with their free memory, or why CUDA is not usable (the device registry's reason)."""
    from kinetic.devices import DEVICES

    reason = DEVICES["cuda"].unavailable()
    if reason:
        return [], reason
    import cupy

    from kinetic.codegen.cuda import nvrtc

    rt = cupy.cuda.runtime
    try:
        driver = rt.driverGetVersion()
        nv = ".".join(map(str, nvrtc.version()))
        return [_cuda_gpu(cupy, index, driver, nv) for index in range(rt.getDeviceCount())], None
    except Exception as e:  # a CUDA error after the registry found it usable (a GPU lost, out of memory)
        return [], f"CUDA reported an error while listing its GPUs ({type(e).__name__}: {e})"


def _cuda_gpu(cupy, index: int, driver: int, nvrtc_version: str) -> Gpu:
    rt = cupy.cuda.runtime
    props = rt.getDeviceProperties(index)
    with cupy.cuda.Device(index):
        free, total = rt.memGetInfo()
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return Gpu("CUDA", name, int(free), int(total), f"driver CUDA {driver // 1000}.{driver % 1000 // 10}, "
               f"NVRTC {nvrtc_version}, compute {props['major']}.{props['minor']}")


def vulkan_gpus() -> tuple[list[Gpu], str | None]:
    """The Vulkan devices the loader lists, or why Vulkan is not usable (the device registry's reason)."""
    from kinetic.devices import DEVICES

    reason = DEVICES["vulkan"].unavailable()
    if reason:
        return [], reason
    from kinetic.codegen.vulkan.device import VulkanUnavailable, physical_devices

    try:
        devices = physical_devices()
    except VulkanUnavailable as e:
        return [], str(e)
    return [Gpu("Vulkan", d.name, None, d.device_memory,
                f"Vulkan {'.'.join(map(str, d.api_version))}, {d.type}", cpu_type=d.is_cpu)
            for d in devices], None


def folder_size(folder: Path) -> int:
    """Bytes of the files below folder (0 when it does not exist)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def disk_free(folder: Path) -> int | None:
    """Free bytes on the disk that holds folder (or its nearest existing parent)."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None
