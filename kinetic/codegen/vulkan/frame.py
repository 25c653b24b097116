"""The frame most Vulkan kernels share, declared once: storage buffers that are read, then the one
buffer written, u32 push constants (rows first), and one compute entry point of 1-D workgroups.

Owns: `frame` (the module, its bindings in order, its push constants and the entry's Function) and
`Frame.kernel` (ending the entry and making the Kernel record: every buffer read-only but the last,
the push constants' size). Does not own a kernel's body, the SPIR-V itself (spirv.py), nor kernels
with another frame (several outputs, shared arrays sized by the target: matvec*.py, attention's
softmax rows), which declare theirs in full.
"""

from __future__ import annotations

from dataclasses import dataclass

from kinetic.codegen.vulkan.device import Kernel
from kinetic.codegen.vulkan.spirv import Function, Module


@dataclass(frozen=True)
class Frame:
    """A kernel under construction: `buffers` the bindings' variables in binding order (the last is
    the one written), `params` the push-constant block of `n_push` u32s."""

    m: Module
    fn: Function
    buffers: list[int]
    params: int
    workgroup: int
    n_push: int

    def push(self, i: int = 0) -> int:
        """Push constant i (0: the rows) as a u32."""
        return self.fn.push(self.params, i, self.m.u32)

    def kernel(self, name: str) -> Kernel:
        """Ends the entry point and returns the Kernel."""
        self.fn.end()
        readonly = (True,) * (len(self.buffers) - 1) + (False,)
        return Kernel(name, self.m.to_bytes(), readonly, (self.workgroup, 1, 1), push_size=4 * self.n_push)


def frame(*bindings: tuple[str, str], workgroup: int, push: int = 1) -> Frame:
    """A module with storage buffers `bindings` ((name, element type: "f32", "u32" or "i32"), in
    binding order, the last one written and the others read), `push` u32 push constants and the
    compute entry of `workgroup` invocations."""
    m = Module()
    last = len(bindings) - 1
    buffers = [m.storage_buffer(i, getattr(m, elem), readonly=i < last, name=name)
               for i, (name, elem) in enumerate(bindings)]
    params, _ = m.push_constants([m.u32] * push)
    return Frame(m, m.compute_entry((workgroup, 1, 1)), buffers, params, workgroup, push)
