"""Renders elementwise calls of the C library's float functions: y[i] = f(x[i]) for cosf, sinf, ...

Owns: `render_libm_map(name)`, a loop calling the process's own `cosf`/`sinf`/`expf`/`tanhf`, the
very functions the reference reaches one value at a time through ctypes (numerics.libm_f32), so the
compiled step gets the reference's values at native speed (the rotary tables of a pass).
"""

from __future__ import annotations

from kinetic.codegen.cpu.llvm_ir import Function, module

FUNCTIONS = ("cosf", "sinf", "expf", "tanhf")


def render_libm_map(name: str) -> tuple[str, str]:
    if name not in FUNCTIONS:
        raise ValueError(f"no C library map for {name!r}")
    fn = Function(f"kin_map_{name}", [("ptr", "x"), ("ptr", "y"), ("i64", "n")])

    def body(i: str, _carried: list[str]) -> list[str]:
        x = fn.load("float", fn.gep("%x", i, "float"), 4)
        fn.store("float", fn.v(f"call float @{name}(float {x})"), fn.gep("%y", i, "float"), 4)
        return []

    fn.loop(0, "%n", [], body)
    fn.do("ret void")
    return module([fn], [f"declare float @{name}(float)"]), fn.name
