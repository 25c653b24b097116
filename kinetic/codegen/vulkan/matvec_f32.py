"""Matrix-vector products for F32 weights on Vulkan, in the order of `numerics/dots.py`'s `float_dot`
(ggml_vec_dot_f32 as the reference builds it), reading f32 rows.

Owns: `render_matvec_f32`. Does not own the dispatch (ops.py: no quantizer, the activations stay
f32), the weights' upload (ops.py / model.py) or the meaning (numerics). F32 weights are rare in
GGUF files (the mixture-of-experts routers, `ffn_gate_inp`, and small tensors llama-quantize keeps).

float_dot's F32 order: 64 float lanes per output, lane i summing fma(x, w, lane) over values 64c + i
of the chunks c in order (builders.fma: rounded once); t16[i] = (lane i + lane 32 + i) + (lane
16 + i + lane 48 + i), then _mm512_reduce_add_ps over t16 (matvec_float.reduce16). The K % 64 last
values are ggml's leftover loop as GCC vectorized it: the first (K % 64) // 8 * 8 of them added to
the sum one by one as rounded products (total + f32(x*w)), the last K % 8 by fmas. All in float32:
no float64 needed.

Layout (matvec_float's frame, shared): a workgroup of 4 outputs x 32 invocations, invocation t holding lanes t and
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
from kinetic.codegen.vulkan.matvec_float import (  # noqa: F401 (OUTPUTS_PER_GROUP: ops.py's grid)
    OUTPUTS_PER_GROUP,
    close_frame,
    first_invocation,
    open_frame,
    reduce16,
    store_output,
)
from kinetic.codegen.vulkan.spirv import Function
from kinetic.ir.numerics.dots import FLOAT_CHUNK

SUPPORTED = (Q.F32,)


def render_matvec_f32(t: Target, n_out: int, k: int, experts: bool = False) -> Kernel:
    """Bindings: weights f32 [n_out*K], x f32 [rows*K], y f32 [rows*n_out] (with `experts`,
    expert_ids u32 [rows]: matvec_float.open_frame)."""
    main = k - k % FLOAT_CHUNK
    frame = open_frame(n_out, k, weight_type="f32", experts=experts)
    fn, rows = frame.fn, frame.rows
    with first_invocation(frame, n_out, _lanes(fn, t, frame.weights, frame.x, rows, frame.lane, main)) as held:
        total = reduce16(fn, [fn.fadd(held[i], held[16 + i]) for i in range(16)])
        store_output(frame, n_out, _tail(fn, t, frame.weights, frame.x, rows, total, main, k))
    return close_frame(frame, f"matvec_f32_{n_out}x{k}{'_experts' if experts else ''}")


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

