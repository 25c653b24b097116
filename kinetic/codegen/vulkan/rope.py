"""Rotary embedding: one invocation per pair of values of a head.

The angles' cosines and sines come in as a table f32 [rows, n_rot/2] computed on the host by
`numerics.rope_cos_sin` (the C library's powf, cosf and sinf, as ggml's rope cache builds them): a
device's own sin/cos are only accurate to about 2^-11 in Vulkan, and the table is small (the CPU
step passes the same table). The kernel applies ggml's rotation as GCC contracts it, each fma
rounding once (builders.fma):

    y0 = fma(x0, cos, -(x1 * sin))        y1 = fma(x0, sin, x1 * cos)

with pairs (2i, 2i+1) in the normal layout and (i, i + n_rot/2) in NeoX's; values past n_rot are
copied. With fmas that round once this is the reference bit for bit on every device.
"""

from __future__ import annotations

from kinetic.codegen.vulkan import builders
from kinetic.codegen.vulkan.builders import Target
from kinetic.codegen.vulkan.device import Kernel, Unsupported
from kinetic.codegen.vulkan.elementwise import flat_index
from kinetic.codegen.vulkan.frame import frame
from kinetic.codegen.vulkan.spirv import Op

WORKGROUP = 64


def render_rope(t: Target, n_head: int, head_dim: int, n_rot: int, neox: bool) -> Kernel:
    """Bindings: x f32 [rows, n_head*head_dim], cos and sin f32 [rows, n_rot/2], y (same as x).
    Push constant: the number of rows. One invocation per (row, head, pair)."""
    if n_rot % 2 or not 0 < n_rot <= head_dim or head_dim % 2:
        raise Unsupported(f"rope: n_rot {n_rot} must be even, positive and at most head_dim {head_dim}")
    half, pairs = n_rot // 2, head_dim // 2
    f = frame(("x", "f32"), ("cos", "f32"), ("sin", "f32"), ("y", "f32"), workgroup=WORKGROUP)
    m, fn, (x, cos_t, sin_t, y) = f.m, f.fn, f.buffers
    index = flat_index(fn, WORKGROUP)
    with fn.if_(fn.icmp(Op.ULessThan, index, fn.imul(f.push(), m.u(n_head * pairs)))):
        p = fn.umod(index, m.u(pairs))
        head_row = fn.udiv(index, m.u(pairs))  # row * n_head + head
        row = fn.udiv(head_row, m.u(n_head))
        base = fn.imul(head_row, m.u(head_dim))
        rotated = fn.icmp(Op.ULessThan, p, m.u(half))
        if neox:
            i0, i1 = p, fn.iadd(p, m.u(half))
        else:
            i0, i1 = fn.imul(p, m.u(2)), fn.iadd(fn.imul(p, m.u(2)), m.u(1))
        # past n_rot the pair is just the next two values, copied
        tail0 = fn.iadd(m.u(n_rot), fn.imul(fn.isub(p, m.u(half)), m.u(2)))
        i0 = fn.select(rotated, i0, tail0)
        i1 = fn.select(rotated, i1, fn.iadd(tail0, m.u(1)))
        x0 = fn.buf_load(x, fn.iadd(base, i0))
        x1 = fn.buf_load(x, fn.iadd(base, i1))
        angle = fn.iadd(fn.imul(row, m.u(half)), fn.select(rotated, p, m.u(0)))
        c = fn.buf_load(cos_t, angle)
        s = fn.buf_load(sin_t, angle)
        y0 = builders.fma(fn, t, x0, c, fn.fneg(fn.fmul(x1, s)))
        y1 = builders.fma(fn, t, x0, s, fn.fmul(x1, c))
        fn.buf_store(y, fn.iadd(base, i0), fn.select(rotated, y0, x0))
        fn.buf_store(y, fn.iadd(base, i1), fn.select(rotated, y1, x1))
    return f.kernel(f"rope_{n_head}x{head_dim}_{n_rot}_{'neox' if neox else 'normal'}")
