"""The `concat` op on Vulkan: each row of two f32 tensors side by side (a prediction block's embedded
token and trunk row, kinetic/frontend/mtp_block.py); one invocation per output value.

Owns: `render_concat` and `record_concat` (its dispatch into a pass, kernels.py's row). The values
are moved as u32 words, so their bits are the reference's (kinetic/ir/reference.py's `concat`, NaN
payloads included) on every device. Does not own the op's meaning or type
(kinetic/ir/op_groups/lookups.py), nor the pass's buffers (recorder.py).
"""

from __future__ import annotations

from kinetic.codegen.vulkan.device import Kernel
from kinetic.codegen.vulkan.elementwise import flat_index
from kinetic.codegen.vulkan.frame import frame
from kinetic.codegen.vulkan.gather import each_of_rows
from kinetic.codegen.vulkan.spirv import Op
from kinetic.ir.graph import Node

WORKGROUP = 256


def render_concat(width_a: int, width_b: int) -> Kernel:
    """out[r, c] = a[r, c] for c < width_a, else b[r, c - width_a]: bindings a f32 [rows, width_a],
    b f32 [rows, width_b], out f32 [rows, width_a + width_b]. Push constant: rows."""
    f = frame(("a", "u32"), ("b", "u32"), ("out", "u32"), workgroup=WORKGROUP)  # bits, moved as they are
    m, fn, (a, b, out) = f.m, f.fn, f.buffers
    i = flat_index(fn, WORKGROUP)
    with each_of_rows(fn, f.params, i, width_a + width_b) as (row, col):
        with fn.if_(fn.icmp(Op.ULessThan, col, m.u(width_a))):
            fn.buf_store(out, i, fn.buf_load(a, fn.iadd(fn.imul(row, m.u(width_a)), col)))
        with fn.if_(fn.icmp(Op.UGreaterThanEqual, col, m.u(width_a))):
            src = fn.iadd(fn.imul(row, m.u(width_b)), fn.isub(col, m.u(width_a)))
            fn.buf_store(out, i, fn.buf_load(b, src))
    return f.kernel(f"concat_{width_a}_{width_b}")


def record_concat(p, node: Node, ins, out, n: int) -> None:
    """One dispatch over the pass's rows (kernels.py's `computed` row)."""
    widths = tuple(p.width(p.graph.node(i)) for i in node.inputs)
    kernel = p.ops.kernel(("concat", *widths), lambda: render_concat(*widths))
    p.dispatch(kernel, [ins[0], ins[1], out], n * sum(widths), WORKGROUP, n)
