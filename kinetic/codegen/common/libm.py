"""The C library's float functions over arrays at native speed: host-side exact math that several
devices need (the cos/sin of rotary tables), with the values numerics.libm_f32 gives one at a time.

Owns: `render_libm_map(name)` (LLVM IR of y[i] = name(x[i]) calling the process's own `cosf`,
`sinf`, `expf` or `tanhf`: the very functions the reference reaches through ctypes), that loop
compiled once per process (`libm_map_address`, an MCJIT of its own: the loop only calls the C
library, so no CPU features or kernel cache are involved) and `libm_map(name, x)`. Does not own any
device's kernels; the CPU's compiled step calls the same compiled loop from its tape.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from kinetic.ir import numerics

FUNCTIONS = ("cosf", "sinf", "expf", "tanhf")
MAP_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def render_libm_map(name: str) -> tuple[str, str]:
    """(module text, function name) of `void kin_map_<name>(float *x, float *y, i64 n)`."""
    if name not in FUNCTIONS:
        raise ValueError(f"no C library map for {name!r}")
    fn = f"kin_map_{name}"
    return f"""declare float @{name}(float)

define void @{fn}(ptr %x, ptr %y, i64 %n) {{
entry:
  %empty = icmp sle i64 %n, 0
  br i1 %empty, label %done, label %body
body:
  %i = phi i64 [0, %entry], [%next, %body]
  %px = getelementptr inbounds float, ptr %x, i64 %i
  %v = load float, ptr %px, align 4
  %r = call float @{name}(float %v)
  %py = getelementptr inbounds float, ptr %y, i64 %i
  store float %r, ptr %py, align 4
  %next = add i64 %i, 1
  %more = icmp slt i64 %next, %n
  br i1 %more, label %body, label %done
done:
  ret void
}}
""", fn


class _Compiler:
    """One MCJIT engine for the maps, made on first use."""

    def __init__(self):
        import llvmlite.binding as llvm

        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        self.llvm = llvm
        self.machine = llvm.Target.from_default_triple().create_target_machine(opt=2, reloc="static",
                                                                               codemodel="jitdefault")
        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self.machine)
        self.addresses: dict[str, int] = {}

    def address(self, name: str) -> int:
        if name not in self.addresses:
            text, fn = render_libm_map(name)
            module = self.llvm.parse_assembly(text)
            module.verify()
            self.engine.add_module(module)
            self.engine.finalize_object()
            self.addresses[name] = self.engine.get_function_address(fn)
        return self.addresses[name]


_compiler: _Compiler | None = None
_lock = threading.Lock()
_maps: dict[str, object] = {}


def libm_map_address(name: str) -> int:
    """The address of the compiled map of the C library's `name` (MAP_SIGNATURE), compiled once."""
    global _compiler
    with _lock:
        if _compiler is None:
            _compiler = _Compiler()
        return _compiler.address(name)


def libm_map(name: str, x: np.ndarray) -> np.ndarray:
    """The C library's float function over an array: numerics.libm_f32's values, through the compiled
    map (numerics' own call per value where llvmlite cannot compile here)."""
    fn = _maps.get(name)
    if fn is None:
        try:
            fn = _maps[name] = MAP_SIGNATURE(libm_map_address(name))
        except (ImportError, OSError, RuntimeError):  # no usable LLVM: the reference's own path
            return numerics.libm_f32(name, x)
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    fn(x.ctypes.data, out.ctypes.data, x.size)
    return out
