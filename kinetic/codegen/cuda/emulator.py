"""Running the generated CUDA C on the host: the same kernel text, compiled by a C++ compiler against
the lockstep emulation of prelude.py, launched through ctypes on numpy arrays.

Owns: building a program's host library (g++ or clang++, cached by content hash beside the NVRTC
cache) and launching its kernels with every buffer registered, so that an access outside the
launch's buffers, a misaligned one or a write to an input raises `EmulationError` naming the buffer.
Does not own: the kernels (gemv.py, pointwise.py) or what they should compute (the IR reference).

What the emulation proves and what it does not:

* It runs exactly the kernel text NVRTC compiles, with the same roundings (see prelude.py), so a
  wrong index, a wrong shift or mask, a wrong reduction order or a kernel that reads another row's
  data gives another answer than the reference, and the tests fail.
* Warps run one at a time between barriers, their lanes in lockstep; shuffles exchange what every
  lane computed before them. By default warps and lanes run in reverse order; `forward=True` builds
  the other order, and the tests require both to agree: a result that depends on the order of
  threads the hardware does not promise (a missing barrier, a race on shared memory) shows up there.
* It does not model: the memory model between blocks (kernels here never communicate across blocks),
  divergent shuffles (the language allows shuffles only in warp-uniform code, which the host
  compiler enforces), timing, occupancy, or the device's own compiler (ptxas) - registers and spills
  come from NVRTC (nvrtc.py), and a GPU run (tests marked gpu) checks the real thing.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np

from kinetic.codegen.cuda.kernel import Kernel, program_source
from kinetic.codegen.cuda.nvrtc import default_cache_dir

CXX_FLAGS = ("-std=c++17", "-O1", "-shared", "-fPIC", "-ffp-contract=off", "-fno-fast-math", "-fno-strict-aliasing",
             "-w")
_ERRORS = {1: "outside every buffer of the launch", 2: "misaligned", 3: "a write to an input buffer"}


class EmulationError(RuntimeError):
    """A kernel misbehaved on the host, or no host compiler is available."""


def compiler() -> str | None:
    """The host C++ compiler the emulation uses, or None."""
    for name in (os.environ.get("CXX"), "g++", "clang++", "c++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def unavailable_reason() -> str | None:
    return None if compiler() else "no host C++ compiler (g++ or clang++) to build the CUDA emulation"


class HostProgram:
    """A set of kernels compiled for the host; `launch` runs one on numpy arrays."""

    def __init__(self, kernels: list[Kernel], *, forward: bool = False, cache_dir: Path | None = None):
        self.kernels = {k.name: k for k in kernels}
        self.source = program_source(kernels, "host")
        self.forward = forward
        self._lib = ctypes.CDLL(str(self._build(Path(cache_dir) if cache_dir else default_cache_dir() / "host")))
        self._lib.kemu_error_address.restype = ctypes.c_void_p
        self._lib.kemu_barrier_count.restype = ctypes.c_long
        self._lock = threading.Lock()

    def _build(self, folder: Path) -> Path:
        cxx = compiler()
        if cxx is None:
            raise EmulationError(unavailable_reason())
        flags = [*CXX_FLAGS, *(["-DKEMU_FORWARD"] if self.forward else [])]
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
        key = hashlib.sha256("\n".join([*version, " ".join(flags), self.source]).encode()).hexdigest()
        lib = folder / f"{key}.so"
        if lib.exists():
            return lib
        folder.mkdir(parents=True, exist_ok=True)
        tag = f"{os.getpid()}.{threading.get_ident()}"
        src, tmp = folder / f".{key}.{tag}.cpp", folder / f".{key}.{tag}.so"
        src.write_text(self.source)
        try:
            done = subprocess.run([cxx, *flags, str(src), "-o", str(tmp)], capture_output=True, text=True)
            if done.returncode != 0:
                raise EmulationError(f"the host compiler rejected the kernels:\n{done.stderr[:4000]}")
            tmp.replace(lib)
        finally:
            src.unlink(missing_ok=True)
        return lib

    def launch(self, name: str, rows: int, *args) -> int:
        """Run kernel `name` over `rows` rows with its parameters in order (numpy arrays for pointers,
        Python numbers for scalars); returns the number of block barriers executed. Arrays must be
        C-contiguous; output arrays are written in place."""
        kernel = self.kernels[name]
        if len(args) != len(kernel.params):
            raise TypeError(f"{name} takes {len(kernel.params)} arguments, got {len(args)}")
        c_args, buffers = [], []
        for p, a in zip(kernel.params, args, strict=True):
            if p.is_pointer:
                if not isinstance(a, np.ndarray) or not a.flags.c_contiguous:
                    raise TypeError(f"{name}: {p.name} must be a C-contiguous numpy array")
                if p.writable and not a.flags.writeable:
                    raise TypeError(f"{name}: {p.name} is written and must be writable")
                buffers.append((p, a))
                c_args.append(ctypes.c_void_p(a.ctypes.data))
            else:
                c_args.append(ctypes.c_int(a) if p.ctype == "int" else ctypes.c_float(a))
        gx, gy = kernel.grid(rows)
        with self._lock:
            self._lib.kemu_reset()
            for p, a in buffers:
                self._lib.kemu_register(ctypes.c_void_p(a.ctypes.data), ctypes.c_long(a.nbytes), int(p.writable))
            getattr(self._lib, name)(ctypes.c_int(gx), ctypes.c_int(gy), *c_args)
            error = self._lib.kemu_error()
            if error:
                raise EmulationError(f"{name}: {self._describe(error, self._lib.kemu_error_address(), buffers)}")
            return int(self._lib.kemu_barrier_count())

    @staticmethod
    def _describe(error: int, address: int, buffers) -> str:
        for p, a in buffers:
            start = a.ctypes.data
            if start - 4096 <= address < start + a.nbytes + 4096:
                return f"{_ERRORS[error]}: byte {address - start} of {p.name} ({a.nbytes} bytes)"
        return f"{_ERRORS[error]}: address {address:#x}, near no buffer"
