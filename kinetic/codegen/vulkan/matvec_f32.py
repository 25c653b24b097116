"""Matrix-vector products for F32 weights on Vulkan, in the order of `numerics/dots.py`'s `float_dot`
(ggml_vec_dot_f32 as the reference builds it), reading f32 rows.

Owns: `render_matvec_f32`. Does not own the dispatch (ops.py: no quantizer, the activations stay
f32), the weights' upload (ops.py / model.py) or the meaning (numerics). F32 weights are rare in
GGUF files (the mixture-of-experts routers, `ffn_gate_inp`, and small tensors llama-quantize keeps).

float_dot's F32 order: 64 float lanes per output, lane i summing fma(x, w, lane) over values 64c + i
of the chunks c in order (builders.fma: rounded once); t16[i] = (lane i + lane 32 + i) + (lane
16 + i + lane 48 + i), then _mm512_reduce_add_ps over t16 (matvec_float's reduce16). The K % 64 last
values are ggml's leftover loop as GCC vectorized it: the first (K % 64) // 8 * 8 of them added to
the sum one by one as rounded products (total + f32(x*w)), the last K % 8 by fmas. All in float32:
no float64 needed.

Layout (matvec_float's): a workgroup of 4 outputs x 32 invocations, invocation t holding lanes t and
t + 32 (its own add is t16's inner pair); the lanes go through shared memory and the output's first
invocation sums them in the order above and adds the tail. Workgroups: (ceil(n_out / 4), rows).
Rows never mix and nothing depends on the number of rows: a row in a batch is bit-identical to the
row alone.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.vulkan import builders
from kinetic.codegen.vulkan.builders import Target
from kinetic.codegen.vulkan.device import Kernel
from kinetic.codegen.vulkan.matvec_float import INVOCATIONS, OUTPUTS_PER_GROUP, WORKGROUP, _reduce16
from kinetic.codegen.vulkan.spirv import GLSL, BuiltIn, Function, Module, Op
from kinetic.ir.numerics.dots import FLOAT_CHUNK

SUPPORTED = (Q.F32,)


def render_matvec_f32(t: Target, n_out: int, k: int) -> Kernel:
    """Bindings: weights f32 [n_out*K], x f32 [rows*K], y f32 [rows*n_out]."""
    main = k - k % FLOAT_CHUNK
    m = Module()
    w = m.storage_buffer(0, m.f32, readonly=True, name="weights")
    x = m.storage_buffer(1, m.f32, readonly=True, name="x")
    y = m.storage_buffer(2, m.f32, name="y")
    scratch = m.shared_array(m.f32, WORKGROUP, "lanes")
    fn = m.compute_entry((WORKGROUP, 1, 1))
    index = fn.builtin(BuiltIn.LocalInvocationIndex)
    lane, local_out = fn.band(index, m.u(INVOCATIONS - 1)), fn.shr(index, m.u(5))
    wg = fn.builtin(BuiltIn.WorkgroupId)
    row_x = fn.emit(Op.CompositeExtract, m.u32, wg, 1)
    n = fn.iadd(fn.imul(fn.emit(Op.CompositeExtract, m.u32, wg, 0), m.u(OUTPUTS_PER_GROUP)), local_out)
    n_read = fn.glsl2(GLSL.UMin, n, m.u(n_out - 1))  # past n_out: read the last row, store nothing
    rows = (fn.imul(n_read, m.u(k)), fn.imul(row_x, m.u(k)))  # first weight, first activation
    fn.store(fn.shared_ptr(scratch, index), _lanes(fn, t, w, x, rows, lane, main))
    fn.workgroup_barrier()
    first = fn.logical_and(fn.icmp(Op.IEqual, lane, m.u(0)), fn.icmp(Op.ULessThan, n, m.u(n_out)))
    with fn.if_(first):
        base = fn.imul(local_out, m.u(INVOCATIONS))
        held = [fn.load(fn.shared_ptr(scratch, fn.iadd(base, m.u(i)))) for i in range(INVOCATIONS)]
        total = _reduce16(fn, [fn.fadd(held[i], held[16 + i]) for i in range(16)])
        total = _tail(fn, t, w, x, rows, total, main, k)
        fn.buf_store(y, fn.iadd(fn.imul(row_x, m.u(n_out)), n), total)
    fn.end()
    return Kernel(f"matvec_f32_{n_out}x{k}", m.to_bytes(), (True, True, False), (WORKGROUP, 1, 1))


def _lanes(fn: Function, t: Target, w, x, rows, lane: int, main: int) -> int:
    """This invocation's lanes `lane` and `lane` + 32 over the chunks (fmas), added."""
    m = fn.m
    accs = fn.local(m.f32, m.f(0.0)), fn.local(m.f32, m.f(0.0))
    with fn.loop(m.u(0), m.u(main), FLOAT_CHUNK) as c:
        for acc, offset in zip(accs, (0, 32), strict=True):
            at = fn.iadd(c, fn.iadd(lane, m.u(offset)))
            xv, wv = fn.buf_load(x, fn.iadd(rows[1], at)), fn.buf_load(w, fn.iadd(rows[0], at))
            fn.store(acc, builders.fma(fn, t, xv, wv, fn.load(acc)))
    return fn.fadd(fn.load(accs[0]), fn.load(accs[1]))


def _tail(fn: Function, t: Target, w, x, rows, total: int, main: int, k: int) -> int:
    """total plus values main .. k - 1 in ggml's leftover order: rounded products added up to the
    last whole 8, then fmas (unrolled: fewer than 64 values)."""
    m = fn.m
    unfused = main + (k - main) // 8 * 8
    for i in range(main, k):
        xv, wv = fn.buf_load(x, fn.iadd(rows[1], m.u(i))), fn.buf_load(w, fn.iadd(rows[0], m.u(i)))
        total = builders.add(fn, total, fn.fmul(xv, wv)) if i < unfused else builders.fma(fn, t, xv, wv, total)
    return total

