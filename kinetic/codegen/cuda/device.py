"""Is CUDA usable here, and running compiled kernels on a GPU through CuPy.

Owns: `unavailable_reason()` (one line saying why `--device cuda` cannot run: no NVRTC, no CuPy, no
driver, no GPU, a GPU too old) and `GpuProgram`, which compiles a set of kernels for the device's
architecture (nvrtc.py, cached), loads the cubin with CuPy and launches kernels on CuPy arrays.
Does not own: the runtime (weights on the device, the KV cache, CUDA graphs: model.py, plan.py,
backends.py).
"""

from __future__ import annotations

import ctypes

from kinetic.codegen.cuda import nvrtc
from kinetic.codegen.cuda.caps import ARCHS, arch_for
from kinetic.codegen.cuda.kernel import Kernel, program_source
from kinetic.errors import KineticError

MIN_CAPABILITY = (7, 5)  # the oldest listed architecture (sm_75): dp4a, and NVRTC 12.x and 13.x target it


def unavailable_reason() -> str | None:
    """None when kernels can be compiled and run on a CUDA GPU here, else why not, in one line."""
    reason = nvrtc.unavailable_reason()
    if reason:
        return reason
    if not _driver_loads():
        return "no NVIDIA driver here (libcuda.so.1 cannot be loaded)"
    try:
        import cupy
    except Exception as e:  # ImportError, or a CuPy built for another CUDA failing at import
        return f"CuPy is not installed or does not load ({type(e).__name__}: {e}); pip install 'kinetic-engine[cuda]'"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # cudaErrorInsufficientDriver, cudaErrorNoDevice, a missing libcuda
        return f"no usable CUDA driver or GPU ({type(e).__name__}: {e})"
    if count == 0:
        return "no CUDA GPU is visible"
    major, minor = _capability(0)
    if (major, minor) < MIN_CAPABILITY:
        return f"the GPU has compute capability {major}.{minor}; Kinetic's CUDA kernels need 7.5 or newer"
    return None


def _driver_loads() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def require_cuda() -> None:
    """Raise a KineticError saying why when CUDA cannot be used (for `--device cuda`)."""
    reason = unavailable_reason()
    if reason:
        raise KineticError(f"device 'cuda' is not usable: {reason}", "Use --device cpu, or --device auto.")


def _capability(device: int) -> tuple[int, int]:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(device)
    return int(props["major"]), int(props["minor"])


class GpuProgram:
    """Kernels compiled for the current device (a listed architecture's cubin, else PTX) and loaded."""

    def __init__(self, kernels: list[Kernel]):
        import cupy

        self.kernels = {k.name: k for k in kernels}
        major, minor = _capability(cupy.cuda.Device().id)
        target = arch_for(major, minor) or nvrtc.PTX_TARGET
        self.compiled = nvrtc.compile_program(program_source(kernels, "cuda"), target)
        if self.compiled.path is None:
            raise RuntimeError("the compiled kernels could not be written to the cache for CuPy to load")
        self.arch = ARCHS.get(target)
        self.module = cupy.RawModule(path=str(self.compiled.path))

    def launch(self, name: str, rows: int, *args) -> None:
        """Run kernel `name` over `rows` rows: CuPy arrays for pointers, Python numbers for scalars."""
        import numpy as np

        kernel = self.kernels[name]
        values = [a if p.is_pointer else (np.int32(a) if p.ctype == "int" else np.float32(a))
                  for p, a in zip(kernel.params, args, strict=True)]
        self.module.get_function(name)(kernel.grid(rows), (kernel.threads,), tuple(values))
