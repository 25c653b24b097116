"""Vulkan's layer norm (the `layer_norm` op of encoder models): one workgroup per row.

Owns the kernel and its order, the reference's (kinetic/ir/numerics/layer_norm.py, ggml_norm on x86
with AVX-512), so a row gives the reference's bits: invocation 0 sums the row in float64 in order and
rounds it to f32, mean = that / n in f32; then the squares of x - mean, 16 at a time, each chunk
reduced as _mm512_reduce_add_ps does (halves 16 -> 8 -> 4, then (l0 + l2) + (l1 + l3)) and added into
a float64 sum, the last n % 16 squares one by one; variance = f32(sum / n) and scale = 1 / sqrt(variance
+ eps) (IEEE square root and division on lavapipe, as rms_norm's kernel relies on); through shared
memory every invocation then writes (x - mean) * scale * weight for its columns. The chains run on one
invocation because their order is a chain. A device without float64 is refused (the mean's sum is
a float64 chain). Does not own the bias (an add_bias dispatch after it) or where it is recorded
(kernels.py).
"""

from __future__ import annotations

from kinetic.codegen.vulkan.device import Kernel
from kinetic.codegen.vulkan.elementwise import flat_group
from kinetic.codegen.vulkan.spirv import GLSL, BuiltIn, Module
from kinetic.codegen.vulkan.spirv_spec import Op

WORKGROUP = 64


def render_layer_norm(width: int, eps: float, weighted: bool) -> Kernel:
    """x f32 [rows, width] -> y f32 [rows, width]; weight f32 [width] when `weighted`. Bindings: x,
    weight (when weighted), y. One workgroup per row, flattened over a 2-D grid."""
    m = Module()
    x = m.storage_buffer(0, m.f32, readonly=True, name="x")
    w = m.storage_buffer(1, m.f32, readonly=True, name="weight") if weighted else None
    y = m.storage_buffer(2 if weighted else 1, m.f32, name="y")
    f64 = m.float_(64)
    stats = m.shared_array(m.f32, 2, "stats")  # mean, scale
    fn = m.compute_entry((WORKGROUP, 1, 1))
    base = fn.imul(flat_group(fn), m.u(width))
    lid = fn.builtin(BuiltIn.LocalInvocationIndex)

    def value(index: int) -> int:
        return fn.buf_load(x, fn.iadd(base, index))

    with fn.if_(fn.icmp(Op.IEqual, lid, m.u(0))):
        total = fn.local(f64, m.const(f64, 0.0))
        with fn.loop(m.u(0), m.u(width), 1) as i:
            fn.store(total, fn.fadd(fn.load(total), fn.convert(value(i), f64)))
        mean = fn.fdiv(fn.convert(fn.load(total), m.f32), m.f(float(width)))

        def square(index: int) -> int:
            d = fn.fsub(value(index), mean)
            return fn.fmul(d, d)

        squares = fn.local(f64, m.const(f64, 0.0))
        main = width - width % 16
        with fn.loop(m.u(0), m.u(main), 16) as c:
            def at(k: int) -> int:
                return square(fn.iadd(c, m.u(k)))

            quads = [fn.fadd(fn.fadd(at(q + 12), at(q + 4)), fn.fadd(at(q + 8), at(q))) for q in range(4)]
            chunk = fn.fadd(fn.fadd(quads[0], quads[2]), fn.fadd(quads[1], quads[3]))
            fn.store(squares, fn.fadd(fn.load(squares), fn.convert(chunk, f64)))
        for i in range(main, width):
            fn.store(squares, fn.fadd(fn.load(squares), fn.convert(square(m.u(i)), f64)))
        variance = fn.convert(fn.fdiv(fn.load(squares), m.const(f64, float(width))), m.f32)
        scale = fn.fdiv(m.f(1.0), fn.glsl1(GLSL.Sqrt, fn.fadd(variance, m.f(eps))))
        fn.store(fn.shared_ptr(stats, m.u(0)), mean)
        fn.store(fn.shared_ptr(stats, m.u(1)), scale)
    fn.workgroup_barrier()
    mean, scale = fn.load(fn.shared_ptr(stats, m.u(0))), fn.load(fn.shared_ptr(stats, m.u(1)))
    with fn.loop(lid, m.u(width), WORKGROUP) as j:
        index = fn.iadd(base, j)
        out = fn.fmul(fn.fsub(fn.buf_load(x, index), mean), scale)
        if weighted:
            out = fn.fmul(out, fn.buf_load(w, j))
        fn.buf_store(y, index, out)
    fn.end()
    readonly = (True, True, False) if weighted else (True, False)
    return Kernel(f"layer_norm_{width}_{'weighted' if weighted else 'plain'}", m.to_bytes(), readonly,
                  (WORKGROUP, 1, 1))
