"""Elementwise kernels: add, mul, scale, SiLU, GELU, SwiGLU, GEGLU, the soft-cap and the bias add, one
invocation per element.

Owns: the float operations of each activation in the reference's order (`kinetic.ir.numerics`):

* add / mul / scale: one IEEE operation each (scale by the attribute rounded to f32);
* add_bias: x plus the bias value of its column (index mod the row width), one IEEE add;
* SiLU: x / (1 + ggml_v_expf(0 - x)), ggml's exp written out: z = fma(x, log2e, 0x1.8p23),
  n = z - 0x1.8p23, b = fma(-n, c_lo, fma(-n, ln2_hi, x)), a degree-5 polynomial of fmas, scaled by
  2^n in two exact steps (so the one rounding is the last multiply, as ldexp's), 0 / inf past |n| > 192;
* GELU: ggml's f16 table (passed as a buffer of its f32 values, `numerics.gelu_table()`), indexed by
  f16(x) rounded half to even by integer operations; x <= -10 gives 0, x >= 10 gives x;
* SwiGLU / GEGLU: the activation of the gate times up;
* softcap: cap * tanhf(x * (1/cap)), the C library's tanhf as tanhf.py spells it.

Every fma rounds once (builders.fma). The one operation Vulkan does not make exact is SiLU's
division (2.5 ulp allowed; lavapipe divides exactly). The element count is a push constant, so one
kernel serves every shape; a 2-D grid covers more than 65535 workgroups.
"""

from __future__ import annotations

import numpy as np

from kinetic.codegen.vulkan import builders
from kinetic.codegen.vulkan.builders import Target
from kinetic.codegen.vulkan.device import Kernel, Unsupported
from kinetic.codegen.vulkan.frame import frame
from kinetic.codegen.vulkan.spirv import GLSL, BuiltIn, Function, Op
from kinetic.codegen.vulkan.tanhf import tanhf_libc

WORKGROUP = 256
UNARY = ("scale", "silu", "gelu", "softcap")
BINARY = ("add", "mul", "swiglu", "geglu")
OPS = UNARY + BINARY


def flat_group(fn: Function) -> int:
    """The workgroup's index in a 2-D grid read row by row (x + y * groups_x)."""
    wg = fn.builtin(BuiltIn.WorkgroupId)
    groups_x = fn.builtin(BuiltIn.NumWorkgroups, 0)
    return fn.iadd(fn.emit(Op.CompositeExtract, fn.m.u32, wg, 0),
                   fn.imul(fn.emit(Op.CompositeExtract, fn.m.u32, wg, 1), groups_x))


def flat_index(fn: Function, width: int) -> int:
    """The global invocation index over a 2-D grid of 1-D workgroups of `width`."""
    return fn.iadd(fn.imul(flat_group(fn), fn.m.u(width)), fn.builtin(BuiltIn.LocalInvocationIndex))


def expf_ggml(fn: Function, t: Target, x: int) -> int:
    """numerics.expf_ggml (ggml_v_expf, AVX-512 variant) for one f32."""
    m = fn.m
    shift = m.f(float.fromhex("0x1.8p23"))
    z = builders.fma(fn, t, x, m.f(float.fromhex("0x1.715476p+0")), shift)
    n = fn.fsub(z, shift)
    neg_n = fn.fneg(n)
    hi = builders.fma(fn, t, neg_n, m.f(float.fromhex("0x1.62e4p-1")), x)
    b = builders.fma(fn, t, neg_n, m.f(float.fromhex("0x1.7f7d1cp-20")), hi)
    u = fn.fmul(b, b)
    c = [m.f(float.fromhex(h)) for h in ("0x1.0e4020p-7", "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2",
                                         "0x1.ffffecp-1")]
    p54 = builders.fma(fn, t, c[0], b, c[1])
    p32 = builders.fma(fn, t, c[2], b, c[3])
    p10 = builders.fma(fn, t, c[4], b, m.f(1.0))
    j = builders.fma(fn, t, builders.fma(fn, t, p54, u, p32), u, p10)
    # 2^n as two exact powers of two (|n| <= 192 here, each half within float's normal exponents):
    # j * 2^n1 is exact, the multiply by 2^n2 rounds once, which is ldexp's correctly rounded result
    k = fn.convert(fn.ext(GLSL.FClamp, m.f32, n, m.f(-192.0), m.f(192.0)), m.i32)
    k1 = fn.emit(Op.SDiv, m.i32, k, m.i(2))
    k2 = fn.isub(k, k1)
    scaled = fn.fmul(fn.fmul(j, pow2(fn, k1)), pow2(fn, k2))
    big = fn.fcmp(Op.FOrdGreaterThan, fn.glsl1(GLSL.FAbs, n), m.f(192.0))
    saturated = fn.select(fn.fcmp(Op.FOrdLessThanEqual, n, m.f(0.0)), m.f(0.0), m.f(float("inf")))
    return fn.select(big, saturated, scaled)


def pow2(fn: Function, k: int) -> int:
    """2^k as f32 for an i32 k in [-126, 127], by its bits."""
    m = fn.m
    return fn.bitcast(fn.shl(fn.bitcast(fn.iadd(k, m.i(127)), m.u32), m.u(23)), m.f32)


def silu(fn: Function, t: Target, x: int) -> int:
    m = fn.m
    e = expf_ggml(fn, t, fn.fsub(m.f(0.0), x))
    return fn.fdiv(x, fn.fadd(m.f(1.0), e))


def gelu(fn: Function, table, x: int) -> int:
    m = fn.m
    y = fn.buf_load(table, builders.f32_to_f16_bits(fn, x))
    y = fn.select(fn.fcmp(Op.FOrdLessThanEqual, x, m.f(-10.0)), m.f(0.0), y)
    return fn.select(fn.fcmp(Op.FOrdGreaterThanEqual, x, m.f(10.0)), x, y)


def render_elementwise(t: Target, op: str, factor: float = 1.0) -> Kernel:
    """Bindings: inputs (one, or gate and up / a and b), then the GELU table for gelu/geglu, then the
    output; push constant: the element count."""
    if op not in OPS:
        raise Unsupported(f"no Vulkan elementwise kernel for {op!r} (have {', '.join(OPS)})")
    n_in = 1 if op in UNARY else 2
    tables = [("gelu_table", "f32")] if op in ("gelu", "geglu") else []
    f = frame(*[(f"in{i}", "f32") for i in range(n_in)], *tables, ("out", "f32"), workgroup=WORKGROUP)
    m, fn, ins, out = f.m, f.fn, f.buffers[:n_in], f.buffers[-1]
    table = f.buffers[n_in] if tables else None
    index = flat_index(fn, WORKGROUP)
    with fn.if_(fn.icmp(Op.ULessThan, index, f.push())):
        xs = [fn.buf_load(b, index) for b in ins]
        if op == "add":
            y = fn.fadd(xs[0], xs[1])
        elif op == "mul":
            y = fn.fmul(xs[0], xs[1])
        elif op == "scale":
            y = fn.fmul(xs[0], m.f(factor))
        elif op == "softcap":  # factor: the cap
            inverse = float(np.float32(1) / np.float32(factor))
            y = fn.fmul(m.f(factor), tanhf_libc(fn, fn.fmul(xs[0], m.f(inverse))))
        elif op in ("silu", "swiglu"):
            y = silu(fn, t, xs[0])
        else:
            y = gelu(fn, table, xs[0])
        if op in ("swiglu", "geglu"):
            y = fn.fmul(y, xs[1])
        fn.buf_store(out, index, y)
    return f.kernel(f"{op}" + (f"_{factor!r}" if op in ("scale", "softcap") else ""))


def render_add_bias(width: int) -> Kernel:
    """out [rows, width] = x + bias [width] on every row. Bindings: x, bias, out; push constant: the
    element count."""
    f = frame(("x", "f32"), ("bias", "f32"), ("out", "f32"), workgroup=WORKGROUP)
    m, fn, (x, bias, out) = f.m, f.fn, f.buffers
    index = flat_index(fn, WORKGROUP)
    with fn.if_(fn.icmp(Op.ULessThan, index, f.push())):
        b = fn.buf_load(bias, fn.umod(index, m.u(width)))
        fn.buf_store(out, index, fn.fadd(fn.buf_load(x, index), b))
    return f.kernel(f"add_bias_{width}")
