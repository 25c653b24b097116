"""RMS norm: one workgroup per (row, group), a fixed order of summation.

Owns the kernel's order, which is the contract on the device (a row's result never depends on how
many rows the pass has, and runs give the same bits):

    invocation i of W (= 64) squares elements i, i+W, i+2W, ... of its group in f32 and adds them
    in that order into its own accumulator, in float64 when the device has it, else float32;
    the W accumulators are summed by the pairwise tree over i (builders.workgroup_sum);
    mean = f32(sum / g)   (the division in the accumulator's type)
    scale = 1.0f / sqrtf(mean + eps)
    y = x * scale, then y * weight (two roundings, as ggml's rms_norm followed by mul)

Against the reference (`numerics.rms_norm`: squares summed in float64 in numpy's order, mean rounded
to f32): with float64 accumulation the two sums differ by a few ulps of a double, which moves the f32
mean only when the sum lies within that of a rounding boundary of f32 (a chance of order 2^-29 per
group), and Vulkan allows sqrt and division a few ulps; on lavapipe (IEEE sqrt and division) the
tests find the results bit-identical. With float32 accumulation the mean carries the float32 sum's
rounding error (a relative 2^-24 per addition along the chain of g/W + log2 W additions), which the
tests bound explicitly.
"""

from __future__ import annotations

from kinetic.codegen.vulkan import builders
from kinetic.codegen.vulkan.builders import Target
from kinetic.codegen.vulkan.device import Kernel, Unsupported
from kinetic.codegen.vulkan.elementwise import flat_group
from kinetic.codegen.vulkan.spirv import GLSL, BuiltIn, Module

WORKGROUP = 64


def render_rms_norm(t: Target, width: int, group: int, eps: float, weight_len: int, f64: bool) -> Kernel:
    """x f32 [rows, width] -> y f32 [rows, width], each run of `group` values normalized (group =
    width for a whole row); weight f32 [weight_len] (weight_len divides width; 0: no weight).
    Bindings: x, weight (when weight_len), y. One workgroup per (row, group), flattened over a 2-D
    grid."""
    g = group or width
    if width % g or (weight_len and width % weight_len):
        raise Unsupported(f"rms_norm: width {width} is not a multiple of group {g} / weight {weight_len}")
    m = Module()
    x = m.storage_buffer(0, m.f32, readonly=True, name="x")
    w = m.storage_buffer(1, m.f32, readonly=True, name="weight") if weight_len else None
    y = m.storage_buffer(2 if weight_len else 1, m.f32, name="y")
    acc_t = m.float_(64) if f64 else m.f32
    scratch = m.shared_array(acc_t, WORKGROUP, "partial")
    sub_scratch = m.shared_array(acc_t, WORKGROUP, "subgroup_partial")
    fn = m.compute_entry((WORKGROUP, 1, 1))
    unit = flat_group(fn)  # one workgroup per (row, group)
    lid = fn.builtin(BuiltIn.LocalInvocationIndex)
    base = fn.imul(unit, m.u(g))  # groups are contiguous runs of g values
    acc = fn.local(acc_t, m.const(acc_t, 0.0))
    with fn.loop(lid, m.u(g), WORKGROUP) as j:
        v = fn.buf_load(x, fn.iadd(base, j))
        sq = fn.fmul(v, v)
        fn.store(acc, fn.fadd(fn.load(acc), fn.convert(sq, acc_t) if f64 else sq))
    total = builders.workgroup_sum(fn, t, scratch, sub_scratch, fn.load(acc), WORKGROUP)
    mean = fn.fdiv(total, m.const(acc_t, float(g)))
    if f64:
        mean = fn.convert(mean, m.f32)
    scale = fn.fdiv(m.f(1.0), fn.glsl1(GLSL.Sqrt, fn.fadd(mean, m.f(eps))))
    with fn.loop(lid, m.u(g), WORKGROUP) as j:
        index = fn.iadd(base, j)
        out = fn.fmul(fn.buf_load(x, index), scale)
        if weight_len:
            out = fn.fmul(out, fn.buf_load(w, fn.umod(index, m.u(weight_len))))
        fn.buf_store(y, index, out)
    fn.end()
    readonly = (True, True, False) if weight_len else (True, False)
    name = f"rms_norm_{width}_{g}_{weight_len}_{'f64' if f64 else 'f32'}"
    return Kernel(name, m.to_bytes(), readonly, (WORKGROUP, 1, 1), full_subgroups=True)

