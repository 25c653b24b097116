"""Where the CUDA runtime's kernels run: a GPU through CuPy, or the host emulation of the same text.

Owns: the few operations the runtime (model.py) needs from a device, with one meaning on both:
buffers of bytes (`empty`, views by slicing), copies in and out (`write`, `read`), compiling a set
of kernels (`compile`), launching one (`launch`), and recording a list of launches to replay
(`record`: a CUDA graph on the GPU, the list itself on the host). Does not own what is launched.

`HostBackend` is what CI runs: the model's kernels compiled by the host C++ compiler against the
lockstep emulation (emulator.py), every launch checked against its buffers. It runs the whole
runtime (plans, buffer reuse, the device KV cache, replay) exactly as the GPU would, only slowly, so
the runtime's bookkeeping is tested without a GPU. `GpuBackend` is the thin CuPy layer under the same
calls; it runs only where a GPU is (scripts/gpu_check.sh).
"""

from __future__ import annotations

import os

import numpy as np

from kinetic.codegen.cuda.kernel import Kernel

ALIGN = 256  # bytes: every view the runtime hands a kernel starts at a multiple of this
# the GPU memory the runtime may use, in bytes (tests and gpu_check's Flywheel case): the emulation's
# whole memory, a cap on a GPU's free memory; unset: no cap (the emulation: no limit)
GPU_BYTES = "KINETIC_GPU_BYTES"


def gpu_bytes_limit() -> int | None:
    limit = os.environ.get(GPU_BYTES)
    return int(limit) if limit else None


class HostBackend:
    """Buffers are numpy byte arrays; kernels run through the host emulation (slow, exact)."""

    name = "the host emulation of the CUDA kernels"
    is_gpu = False

    def __init__(self, *, forward: bool = False):
        self.forward = forward
        self.program = None
        self.launches = 0

    def compile(self, kernels: list[Kernel]) -> None:
        from kinetic.codegen.cuda.emulator import HostProgram

        self.program = HostProgram(kernels, forward=self.forward)

    def empty(self, nbytes: int):
        return np.zeros(_rounded(nbytes), np.uint8)  # zeroed: an unwritten byte reads the same every run

    def host_empty(self, nbytes: int) -> np.ndarray:
        return np.zeros(_rounded(nbytes), np.uint8)

    def write(self, dst, src: np.ndarray) -> None:
        raw = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
        dst[: raw.nbytes] = raw

    def read(self, src, dtype, count: int) -> np.ndarray:
        return src[: count * np.dtype(dtype).itemsize].view(dtype).copy()

    def launch(self, name: str, rows: int, args: tuple) -> None:
        self.launches += 1
        self.program.launch(name, rows, *args)

    def record(self, launches: list[tuple[str, int, tuple]]):
        """A replayable recording of launches (here: the list, run in order)."""

        def replay() -> None:
            for name, rows, args in launches:
                self.launch(name, rows, args)

        return replay

    def synchronize(self) -> None:
        pass

    def free_bytes(self) -> int | None:
        """None (no memory limit), or the emulated GPU's memory in bytes from KINETIC_GPU_BYTES: a small
        budget makes the runtime split layers or cache experts (Flywheel) as on a small GPU."""
        return gpu_bytes_limit()

    def close(self) -> None:
        self.program = None


class GpuBackend:
    """Buffers are CuPy byte arrays on the current device; everything runs on one non-default stream
    (graph capture needs one). Launches of a recorded plan become one CUDA graph."""

    is_gpu = True

    def __init__(self):
        import cupy

        self.cp = cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"]
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        self.program = None
        self._functions: dict[str, object] = {}
        self.launches = 0

    def compile(self, kernels: list[Kernel]) -> None:
        from kinetic.codegen.cuda.device import GpuProgram

        self.program = GpuProgram(kernels)
        # load every function now: nothing may load a module while a graph is being captured
        self._functions = {k.name: self.program.module.get_function(k.name) for k in kernels}

    def empty(self, nbytes: int):
        with self.stream:
            return self.cp.zeros(_rounded(nbytes), self.cp.uint8)

    def host_empty(self, nbytes: int) -> np.ndarray:
        """Page-locked host memory, so copies in and out run at full speed and asynchronously."""
        import cupyx

        out = cupyx.empty_pinned(_rounded(nbytes), np.uint8)
        out[:] = 0
        return out

    def write(self, dst, src: np.ndarray) -> None:
        raw = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
        dst[: raw.nbytes].set(raw, stream=self.stream)

    def read(self, src, dtype, count: int) -> np.ndarray:
        nbytes = count * np.dtype(dtype).itemsize
        out = src[:nbytes].get(stream=self.stream)
        self.stream.synchronize()
        return out.view(dtype)

    def launch(self, name: str, rows: int, args: tuple) -> None:
        kernel = self.program.kernels[name]
        values = tuple(a if p.is_pointer else (np.int32(a) if p.ctype == "int" else np.float32(a))
                       for p, a in zip(kernel.params, args, strict=True))
        self.launches += 1
        with self.stream:
            self._functions[name](kernel.grid(rows), (kernel.threads,), values)

    def record(self, launches: list[tuple[str, int, tuple]]):
        """The launches captured as one CUDA graph; replaying it is one call."""
        self.stream.synchronize()
        self.stream.begin_capture()
        try:
            for name, rows, args in launches:
                self.launch(name, rows, args)
        finally:
            graph = self.stream.end_capture()

        def replay() -> None:
            graph.launch(stream=self.stream)

        return replay

    def synchronize(self) -> None:
        self.stream.synchronize()

    def free_bytes(self) -> int | None:
        free, _total = self.cp.cuda.runtime.memGetInfo()
        free = int(free) + self.cp.get_default_memory_pool().free_bytes()
        limit = gpu_bytes_limit()  # KINETIC_GPU_BYTES: at most that much
        return free if limit is None else min(free, limit)

    def close(self) -> None:
        self.synchronize()
        self._functions, self.program = {}, None
        self.cp.get_default_memory_pool().free_all_blocks()


def _rounded(nbytes: int) -> int:
    return max(ALIGN, -(-int(nbytes) // ALIGN) * ALIGN)
