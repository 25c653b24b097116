"""JIT compilation of rendered IR with llvmlite, and the kernel cache keyed by content hash.

Owns: one MCJIT engine per process, the host target machine, and the on-disk cache of object code in
the user cache directory (~/.cache/kinetic/kernels/, or $XDG_CACHE_HOME/kinetic/kernels/). The key
is the SHA-256 of the IR text plus everything that changes the machine code (llvmlite and LLVM
versions, triple, CPU name, feature string, optimization level), so a second start compiles nothing
and a different host never loads a foreign object. Writes are atomic (temp file + rename), so
concurrent processes at worst compile the same kernel twice.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

from kinetic.codegen.cpu.target import _init_llvm, host
from kinetic.user_cache import cache_dir

OPT_LEVEL = 3


def default_cache_dir() -> Path:
    return cache_dir("kernels")


@dataclass
class CompileStats:
    """What the JIT did, for benchmarks and tests: compiled vs loaded, and seconds spent compiling."""

    compiled: int = 0
    loaded: int = 0
    compile_seconds: list[float] = field(default_factory=list)


class Jit:
    """Compiles (or loads from cache) IR modules and hands back function addresses."""

    def __init__(self, cache_dir: Path | None = None):
        _init_llvm()
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        h = host()
        target = llvm.Target.from_triple(h.triple)
        self._tm = target.create_target_machine(
            cpu=h.cpu, features=h.features, opt=OPT_LEVEL, reloc="static", codemodel="jitdefault"
        )
        self._engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self._tm)
        self._salt = f"{llvmlite.__version__}|{llvm.llvm_version_info}|{h.triple}|{h.cpu}|{h.features}|O{OPT_LEVEL}"
        self._lock = threading.Lock()
        self._addresses: dict[str, int] = {}
        self.stats = CompileStats()

    def key(self, ir: str) -> str:
        return hashlib.sha256((self._salt + "\n" + ir).encode()).hexdigest()

    def address(self, ir: str, name: str) -> int:
        """The address of function `name` defined in module `ir`, compiling at most once per host."""
        key = self.key(ir)
        with self._lock:
            if key not in self._addresses:
                obj = self._load(key) or self._compile(ir, key)
                self._engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
                self._engine.finalize_object()
                self._addresses[key] = self._engine.get_function_address(name)
            return self._addresses[key]

    def _load(self, key: str) -> bytes | None:
        path = self.cache_dir / f"{key}.o"
        if not path.exists():
            return None
        self.stats.loaded += 1
        return path.read_bytes()

    def _compile(self, ir: str, key: str) -> bytes:
        start = time.perf_counter()
        mod = llvm.parse_assembly(ir)
        mod.verify()
        pto = llvm.create_pipeline_tuning_options(speed_level=OPT_LEVEL)
        pb = llvm.create_pass_builder(self._tm, pto)
        pb.getModulePassManager().run(mod, pb)
        obj = self._tm.emit_object(mod)
        self.stats.compile_seconds.append(time.perf_counter() - start)
        self.stats.compiled += 1
        self._store(key, obj)
        return obj

    def _store(self, key: str, obj: bytes) -> None:
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.cache_dir / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp"
            tmp.write_bytes(obj)
            tmp.replace(self.cache_dir / f"{key}.o")
        except OSError:
            pass  # a read-only cache only costs a recompile next start


_default: Jit | None = None


def default_jit() -> Jit:
    global _default
    if _default is None:
        _default = Jit()
    return _default
