"""NVRTC through ctypes: CUDA C to cubin (or PTX) with no GPU, cached by content hash.

Owns: finding libnvrtc (the `nvidia-cuda-nvrtc-cu12` wheel of the `cuda` extra, a CUDA 13 wheel, or
the system's), compiling a program for one architecture with the options that fix its arithmetic,
reading the registers, spills and shared memory that `-Xptxas=-v` reports per kernel, and the
on-disk cache. Does not own: the kernels' text (kernel.py) or loading binaries onto a device
(device.py).

No Python binding is needed: NVRTC's C API is a dozen functions, and calling them directly keeps
the wheel (90 MB, a few seconds to install) the only requirement for compiling. (CuPy's own compile
helpers look up the current device and fail without one, and its getCUBIN returns the cubin one
byte short; cuda-bindings would add a second package for the same calls.)

The cache lives in the user cache directory, ~/.cache/kinetic/cuda/ (or $XDG_CACHE_HOME/kinetic/cuda/),
beside the CPU kernel cache (codegen/cpu/jit.py); the key is the SHA-256 of the NVRTC version, the
target, the options and the source, so another NVRTC or another option never loads a stale binary.
Writes are atomic (temp file + rename).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import importlib.util
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

# Arithmetic as written: no contraction into fmas, IEEE division and square root, subnormals kept.
# The kernels use _rn intrinsics where the order matters anyway; these make plain operators safe too.
OPTIONS = ("--std=c++17", "--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false")
PTX_TARGET = "compute_75"  # PTX for the oldest architecture, which drivers JIT for newer ones

_SONAMES = ("libnvrtc.so.12", "libnvrtc.so.13", "libnvrtc.so")


class NvrtcError(RuntimeError):
    """NVRTC could not be loaded, or rejected a program (the message holds its log)."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kinetic" / "cuda"


def _candidates() -> list[str]:
    """Where libnvrtc may be: the pip wheels' lib folders first, then the loader's search path."""
    found = []
    for package in ("nvidia.cuda_nvrtc", "nvidia.cu13", "nvidia.cu12"):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        for folder in (spec.submodule_search_locations or []) if spec else []:
            for soname in _SONAMES:
                for sub in ("lib", "lib64", "."):
                    path = Path(folder) / sub / soname
                    if path.exists():
                        found.append(str(path))
    found += list(_SONAMES)
    system = ctypes.util.find_library("nvrtc")
    toolkit = [str(p) for p in sorted(Path("/usr/local/cuda/lib64").glob("libnvrtc.so*"))]
    return found + ([system] if system else []) + toolkit


_lib = None
_lib_error: str | None = None
_lock = threading.Lock()


def library():
    """The loaded libnvrtc; raises NvrtcError saying why it cannot be loaded."""
    global _lib, _lib_error
    with _lock:
        if _lib is None and _lib_error is None:
            for path in _candidates():
                try:
                    _lib = ctypes.CDLL(path)
                    break
                except OSError:
                    continue
            else:
                _lib_error = ("NVRTC (libnvrtc) was not found: install the CUDA extra, "
                              "pip install 'kinetic-engine[cuda]' (or nvidia-cuda-nvrtc-cu12)")
        if _lib is None:
            raise NvrtcError(_lib_error)
        return _lib


def unavailable_reason() -> str | None:
    """None when NVRTC can be used, else the reason in one line."""
    try:
        library()
    except NvrtcError as e:
        return str(e)
    return None


def version() -> tuple[int, int]:
    lib = library()
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


@dataclass(frozen=True)
class Resources:
    """What ptxas reported for one kernel on one architecture."""

    registers: int
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    stack: int  # bytes of stack frame
    shared: int  # bytes of static shared memory


@dataclass(frozen=True)
class Compiled:
    target: str  # "sm_90", ... or PTX_TARGET
    binary: bytes  # cubin, or PTX text
    log: str
    resources: dict[str, Resources]  # per kernel name (cubins only)
    path: Path | None  # the cache file holding `binary`, when cached
    cached: bool  # loaded from the cache instead of compiled

    @property
    def is_ptx(self) -> bool:
        return self.target.startswith("compute_")


_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_PROPS = re.compile(r"Function properties for (\w+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str) -> dict[str, Resources]:
    """Registers, spills, stack and shared memory per kernel from an -Xptxas=-v log."""
    out: dict[str, dict] = {}
    current = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = out.setdefault(m.group(1), {"registers": 0, "spill_stores": 0, "spill_loads": 0,
                                                  "stack": 0, "shared": 0})
        elif m := _PROPS.search(line):
            current = out.get(m.group(1), current)
        elif current is not None and (m := _FRAME.search(line)):
            current["stack"], current["spill_stores"], current["spill_loads"] = map(int, m.groups())
        elif current is not None and (m := _USED.search(line)):
            current["registers"] = int(m.group(1))
            if s := _SMEM.search(line):
                current["shared"] = int(s.group(1))
    return {name: Resources(**fields) for name, fields in out.items()}


def _call(lib, fn: str, *args) -> None:
    rc = getattr(lib, fn)(*args)
    if rc != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise NvrtcError(f"{fn} failed: {lib.nvrtcGetErrorString(rc).decode()}")


def _compile_now(source: str, target: str, name: str) -> tuple[bytes, str]:
    lib = library()
    prog = ctypes.c_void_p()
    _call(lib, "nvrtcCreateProgram", ctypes.byref(prog), source.encode(), f"{name}.cu".encode(), 0, None, None)
    try:
        opts = [*OPTIONS, f"--gpu-architecture={target}"]
        if not target.startswith("compute_"):
            opts.append("-Xptxas=-v")
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        _call(lib, "nvrtcGetProgramLogSize", prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        _call(lib, "nvrtcGetProgramLog", prog, buf)
        log = buf.value.decode(errors="replace")
        if rc != 0:
            raise NvrtcError(f"NVRTC rejected {name} for {target}:\n{log}")
        kind = "PTX" if target.startswith("compute_") else "CUBIN"
        _call(lib, f"nvrtcGet{kind}Size", prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        _call(lib, f"nvrtcGet{kind}", prog, buf)
        return buf.raw[: size.value], log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def cache_key(source: str, target: str) -> str:
    salt = f"nvrtc {version()}|{target}|{' '.join(OPTIONS)}"
    return hashlib.sha256((salt + "\n" + source).encode()).hexdigest()


def compile_program(source: str, target: str, *, name: str = "kinetic", cache_dir: Path | None = None,
                    use_cache: bool = True) -> Compiled:
    """Compile `source` for `target` ("sm_90", or PTX_TARGET for PTX), at most once per content."""
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = cache_key(source, target)
    suffix = ".ptx" if target.startswith("compute_") else ".cubin"
    path, log_path = folder / f"{key}{suffix}", folder / f"{key}.log"
    if use_cache and path.exists() and log_path.exists():
        log = log_path.read_text()
        return Compiled(target, path.read_bytes(), log, parse_ptxas(log), path, True)
    binary, log = _compile_now(source, target, name)
    stored = _store(folder, key, suffix, binary, log) if use_cache else None
    return Compiled(target, binary, log, parse_ptxas(log), stored, False)


def _store(folder: Path, key: str, suffix: str, binary: bytes, log: str) -> Path | None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tag = f"{os.getpid()}.{threading.get_ident()}"
        tmp_log, tmp_bin = folder / f".{key}.{tag}.log", folder / f".{key}.{tag}{suffix}"
        tmp_log.write_text(log)
        tmp_bin.write_bytes(binary)
        tmp_log.replace(folder / f"{key}.log")
        tmp_bin.replace(folder / f"{key}{suffix}")  # the binary last: it marks the entry complete
        return folder / f"{key}{suffix}"
    except OSError:
        return None  # a read-only cache only costs a recompile next time
