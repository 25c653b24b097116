"""A rendered CUDA kernel and the program text a set of kernels compiles from.

Owns: `Kernel` (name, launch shape, parameters, body in the lockstep language of prelude.py) and
`program_source`, which puts the same kernel text after either prelude. Does not own: rendering
(gemv.py, pointwise.py, attention.py, gather.py), compiling (nvrtc.py, emulator.py) or launching.

Every kernel is specialized to its shapes (widths, block counts and constants are literals in its
text, as the CPU kernels are); only the number of rows of a pass varies, and it is the grid's y
dimension: block (x, y) computes its share of row y (of rows y*R .. y*R + R-1 for a kernel with
`rows_per_block` R, the GEMM), and a row's result never depends on how many other rows the launch has.
Whatever else changes from pass to pass (token ids, gathered rows, the number of cached keys, where new
keys go) is read from device memory (`const int*` parameters), never passed as a scalar, so a captured
CUDA graph replays every pass with the same parameters. The one scalar that varies, a GEMM's
`n_rows`, is the pass's row count: it changes only with the grid, that is with the pass's shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kinetic.codegen.cuda.logf import libc_logf
from kinetic.codegen.cuda.prelude import prelude
from kinetic.codegen.cuda.tanhf import libc_tanhf

# parameter types a kernel may take, and whether the kernel writes through them
POINTER_TYPES = {"const u8*": False, "const i8*": False, "const u16*": False, "const int*": False,
                 "const float*": False, "i8*": True, "u16*": True, "float*": True}
SCALAR_TYPES = ("int", "float")


@dataclass(frozen=True)
class Param:
    name: str
    ctype: str  # one of POINTER_TYPES or SCALAR_TYPES

    def __post_init__(self) -> None:
        if self.ctype not in POINTER_TYPES and self.ctype not in SCALAR_TYPES:
            raise ValueError(f"parameter {self.name}: unsupported type {self.ctype!r}")

    @property
    def is_pointer(self) -> bool:
        return self.ctype in POINTER_TYPES

    @property
    def writable(self) -> bool:
        return POINTER_TYPES.get(self.ctype, False)

    def declaration(self) -> str:
        return f"{self.ctype} __restrict__ {self.name}" if self.is_pointer else f"{self.ctype} {self.name}"


@dataclass(frozen=True)
class Kernel:
    """One kernel: launched as a grid of (blocks_x, ceil(rows / rows_per_block)) blocks of `threads`
    threads; block (x, y) computes its share of rows y * rows_per_block .. (y + 1) * rows_per_block - 1."""

    name: str
    kind: str  # "gemv", "gemm", "quantize", "norm", "pointwise", "rope", "attention", "gather": its limits (caps.py)
    threads: int
    blocks_x: int
    params: tuple[Param, ...]
    body: str  # LANE/SHARED declarations, BODY, the statements (no KERNEL line, no END_KERNEL)
    shared_bytes: int = 0  # static shared memory the body declares
    rows_per_block: int = 1  # activation rows one block computes (a GEMM's tile; 1 for every other kernel)

    def __post_init__(self) -> None:
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            raise ValueError(f"{self.name}: {self.threads} threads is not a whole number of warps up to 1024")
        if self.rows_per_block < 1:
            raise ValueError(f"{self.name}: {self.rows_per_block} rows per block")
        _check_barriers(self.name, self.body)

    def grid(self, rows: int) -> tuple[int, int]:
        return self.blocks_x, -(-rows // self.rows_per_block)

    def source(self) -> str:
        params = ", ".join(p.declaration() for p in self.params)
        return f"KERNEL({self.name}, {self.threads}, {params})\n{self.body.rstrip()}\nEND_KERNEL\n"


def _check_barriers(name: str, body: str) -> None:
    """Barriers only at the top level of BODY: the emulation orders warps between top-level barriers,
    and a barrier in a loop or branch would not be one it can order (nor, in a branch, a safe one)."""
    depth = 0
    for i, ch in enumerate(body):
        if ch in "{}":
            depth += 1 if ch == "{" else -1
        elif body.startswith("BARRIER()", i) and depth:
            raise ValueError(f"{name}: BARRIER() inside a block; barriers belong at the top level of BODY")


def program_source(kernels: list[Kernel] | tuple[Kernel, ...], target: str) -> str:
    """The whole text of a program: the target's prelude (with the C library's tanhf when a kernel
    calls it, so that other programs' text stays as it was), then each distinct kernel once, by name."""
    seen: dict[str, Kernel] = {}
    for k in kernels:
        if k.name in seen and seen[k.name] != k:
            raise ValueError(f"two different kernels are named {k.name}")
        seen[k.name] = k
    tanhf = libc_tanhf() if any("k_tanhf_libc" in k.body for k in seen.values()) else ""
    logf = libc_logf() if any("k_logf_libc" in k.body for k in seen.values()) else ""
    return prelude(target) + tanhf + logf + "\n" + "\n".join(k.source() for k in seen.values())


def f32_literal(value: float) -> str:
    """A float32 constant as an exact C hex literal (the value rounded to float32 first)."""
    v = float(np.float32(value))
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"no finite float32 literal for {value}")
    return f"{v.hex()}f"


def name_tag(value: float) -> str:
    """A float32 constant as part of a C name: the shortest text that reads back to it, e.g. 1em05."""
    return str(np.float32(value)).replace("-", "m").replace("+", "p").replace(".", "d")


# ---- text helpers for kernel bodies ----


def indent(code: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line if line else line for line in code.splitlines())


def butterfly(var: str, combine: str, masks: tuple[int, ...], indent: int, other: str = "other") -> str:
    """Shuffle `var` with lane ^ m into `other` and combine, for each mask in order (uniform code)."""
    steps = (f"SHFL_XOR({other}, {var}, {m}); LANES {{ L({var}) = {combine}; }}" for m in masks)
    return "\n".join(" " * indent + s for s in steps)


def int_sum(var: str, masks: tuple[int, ...], indent: int = 4) -> str:
    return butterfly(var, f"L({var}) + L(itmp)", masks, indent, other="itmp") + "\n"
