"""Vulkan kernels of the recurrent families' stateless ops: Qwen3.5's `sigmoid` (its gates) and
`head_columns` (each head's query and gate halves of one projection); one invocation per output value.

Owns: `render_sigmoid` (ggml_sigmoid: 1 / (1 + expf(0 - x)), the C library's expf as attention.py's
`expf_libc` forms it exactly, then an IEEE add and divide: numerics.recurrent.sigmoid's roundings;
the division is exact on lavapipe, and Vulkan allows 2.5 ulp elsewhere, as for SiLU) and
`render_head_columns` (bits moved as they are). Does not own their meaning
(kinetic/ir/delta_reference.py), nor the ops that carry a recurrent state (short_conv, ssm_scan,
delta_rule): the Vulkan runner keeps no per-sequence recurrent state yet and refuses a graph holding
a recurrent_state by name (kernels.py, docs/recurrent.md).
"""

from __future__ import annotations

from kinetic.codegen.vulkan.attention import expf_libc
from kinetic.codegen.vulkan.device import Kernel
from kinetic.codegen.vulkan.elementwise import flat_index
from kinetic.codegen.vulkan.frame import frame
from kinetic.codegen.vulkan.gather import each_of_rows
from kinetic.codegen.vulkan.spirv import Op

WORKGROUP = 256


def render_sigmoid() -> Kernel:
    """out = 1 / (1 + expf(0 - x)) per value. Bindings: x f32, the expf table u32 [64]
    (attention.expf_table_words), out f32; push constant: the element count."""
    f = frame(("x", "f32"), ("expf_table", "u32"), ("out", "f32"), workgroup=WORKGROUP)
    m, fn, (x, table, out) = f.m, f.fn, f.buffers
    index = flat_index(fn, WORKGROUP)
    with fn.if_(fn.icmp(Op.ULessThan, index, f.push())):
        e = expf_libc(fn, table, fn.fsub(m.f(0.0), fn.buf_load(x, index)))
        fn.buf_store(out, index, fn.fdiv(m.f(1.0), fn.fadd(m.f(1.0), e)))
    return f.kernel("sigmoid")


def render_head_columns(n_head: int, stride: int, start: int, count: int) -> Kernel:
    """out[r, h*count + c] = x[r, h*stride + start + c]: bindings x f32 [rows, n_head*stride], out f32
    [rows, n_head*count]. Push constant: rows."""
    f = frame(("x", "u32"), ("out", "u32"), workgroup=WORKGROUP)  # bits, moved as they are
    m, fn, (x, out) = f.m, f.fn, f.buffers
    i = flat_index(fn, WORKGROUP)
    with each_of_rows(fn, f.params, i, n_head * count) as (row, col):
        head, within = fn.udiv(col, m.u(count)), fn.umod(col, m.u(count))
        src = fn.iadd(fn.imul(row, m.u(n_head * stride)),
                      fn.iadd(fn.imul(head, m.u(stride)), fn.iadd(m.u(start), within)))
        fn.buf_store(out, i, fn.buf_load(x, src))
    return f.kernel(f"head_columns_{n_head}_{stride}_{start}_{count}")
