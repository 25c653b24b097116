"""Vulkan kernels of the mixture-of-experts router and weighted sum (docs/moe.md); one invocation per
router row, one per output value for the sum.

Owns: `render_softmax_gate` (ggml_soft_max of a row of router logits: the max; ggml_v_expf on each
block of 16 (elementwise.expf_ggml), each block's 16 values summed as _mm512_reduce_add_ps
(matvec_float.reduce16) and added into a double; the C library's expf on the tail (attention.expf_libc),
each added into the double; times the float of 1 / sum), `render_select` (a row's top-k experts,
highest first, ties to the lower expert, on the probabilities plus the optional selection bias, one
f32 add), `render_route_weights` (the chosen experts' probabilities, their sum in a double from +0,
rounded to f32 and clamped at F16's smallest normal, each divided by it, then times the scale unless
it is 0 or 1) and `render_weighted_sum` (each slot's output times its weight, slot 0 + slot 1 + ...).
The sigmoid gate is recurrent.render_sigmoid (the same 1 / (1 + expf(0 - x))). Does not own the ops'
meaning (kinetic/ir/moe_reference.py, kinetic/ir/numerics/moe.py), the expert matmuls (the per-type
matvecs with their `experts` binding, matvec.expert_row) nor which node gets which kernel
(moe_records.py).

A router row is a few dozen values, so one invocation walks it in exactly the reference's order and
no order question arises (as on the CUDA emulation). The chosen experts are stored as u32 and read
from device memory by moe_weights and the expert matvecs, so routing never leaves the device and a
pass stays one command buffer. Selection keeps no set of chosen experts: slot j takes the best expert
strictly after slot j-1's in the order (score descending, then expert ascending), which is the stable
descending sort's j-th. The divisions (the softmax's 1 / sum in float64, the weights' f32 division)
are exact on lavapipe; Vulkan allows 2.5 ulp elsewhere, as for SiLU. The softmax and the weights'
sum need float64 (a device without it is refused by name, as layer_norm).
"""

from __future__ import annotations

from kinetic.codegen.vulkan.attention import expf_libc
from kinetic.codegen.vulkan.builders import Target
from kinetic.codegen.vulkan.device import Kernel
from kinetic.codegen.vulkan.elementwise import expf_ggml, flat_index
from kinetic.codegen.vulkan.frame import frame
from kinetic.codegen.vulkan.matvec_float import reduce16
from kinetic.codegen.vulkan.spirv import Function, Op
from kinetic.ir.numerics.moe import WEIGHT_SUM_FLOOR

ROW_WORKGROUP = 64  # router rows per workgroup (one invocation each)
WORKGROUP = 256  # output values per workgroup of the weighted sum
BLOCK = 16  # ggml_v_expf's lanes: the softmax's blocks


def _each_row(fn: Function, params: int):
    """In the block: this invocation's router row, when below the push constant `rows`."""
    row = flat_index(fn, ROW_WORKGROUP)
    return row, fn.if_(fn.icmp(Op.ULessThan, row, fn.push(params, 0, fn.m.u32)))


def render_softmax_gate(t: Target, n_expert: int) -> Kernel:
    """probs f32 [rows, E] = ggml_soft_max of logits f32 [rows, E]. Bindings: logits, the expf table
    u32 [64] (attention.expf_table_words), probs; push constant: rows."""
    f = frame(("logits", "f32"), ("expf_table", "u32"), ("probs", "f32"), workgroup=ROW_WORKGROUP)
    m, fn, (x, table, out), params = f.m, f.fn, f.buffers, f.params
    f64 = m.float_(64)
    row, in_range = _each_row(fn, params)
    with in_range:
        base = fn.imul(row, m.u(n_expert))
        peak = fn.local(m.f32, fn.buf_load(x, base))
        with fn.loop(m.u(1), m.u(n_expert)) as i:
            v = fn.buf_load(x, fn.iadd(base, i))
            fn.store(peak, fn.select(fn.fcmp(Op.FOrdGreaterThan, v, fn.load(peak)), v, fn.load(peak)))
        top = fn.load(peak)
        total = fn.local(f64, m.const(f64, 0.0))
        blocked = n_expert // BLOCK * BLOCK
        with fn.loop(m.u(0), m.u(blocked), BLOCK) as lo:
            at = [fn.iadd(base, fn.iadd(lo, m.u(j))) for j in range(BLOCK)]
            e = [expf_ggml(fn, t, fn.fsub(fn.buf_load(x, a), top)) for a in at]
            for a, v in zip(at, e, strict=True):
                fn.buf_store(out, a, v)
            fn.store(total, fn.fadd(fn.load(total), fn.convert(reduce16(fn, e), f64)))
        with fn.loop(m.u(blocked), m.u(n_expert)) as i:
            a = fn.iadd(base, i)
            v = expf_libc(fn, table, fn.fsub(fn.buf_load(x, a), top))
            fn.buf_store(out, a, v)
            fn.store(total, fn.fadd(fn.load(total), fn.convert(v, f64)))
        inverse = fn.convert(fn.fdiv(m.const(f64, 1.0), fn.load(total)), m.f32)
        with fn.loop(m.u(0), m.u(n_expert)) as i:
            a = fn.iadd(base, i)
            fn.buf_store(out, a, fn.fmul(fn.buf_load(out, a), inverse))
    return f.kernel(f"moe_softmax_{n_expert}")


def render_select(n_expert: int, n_used: int, biased: bool) -> Kernel:
    """ids u32 [rows, n_used]: each row's n_used highest scores (probs f32 [rows, E], plus bias f32 [E]
    when `biased`), highest first, ties to the lower expert. Bindings: probs, (bias,) ids; push
    constant: rows."""
    bindings = (("probs", "f32"), *((("bias", "f32"),) if biased else ()), ("ids", "u32"))
    f = frame(*bindings, workgroup=ROW_WORKGROUP)
    m, fn, params = f.m, f.fn, f.params
    probs, ids = f.buffers[0], f.buffers[-1]
    bias = f.buffers[1] if biased else None
    row, in_range = _each_row(fn, params)
    with in_range:
        base = fn.imul(row, m.u(n_expert))
        best_score, best = fn.local(m.f32, m.f(0.0)), fn.local(m.u32, m.u(0))
        previous = None  # (score, expert) of the slot before
        for slot in range(n_used):
            fn.store(best, m.u(0xFFFFFFFF))  # none yet
            with fn.loop(m.u(0), m.u(n_expert)) as e:
                score = fn.buf_load(probs, fn.iadd(base, e))
                if bias is not None:
                    score = fn.fadd(score, fn.buf_load(bias, e))
                none_yet = fn.icmp(Op.IEqual, fn.load(best), m.u(0xFFFFFFFF))
                better = fn.logical_or(none_yet, fn.fcmp(Op.FOrdGreaterThan, score, fn.load(best_score)))
                if previous is not None:
                    better = fn.logical_and(better, _after(fn, score, e, *previous))
                with fn.if_(better):
                    fn.store(best_score, score)
                    fn.store(best, e)
            previous = (fn.load(best_score), fn.load(best))
            fn.buf_store(ids, fn.iadd(fn.imul(row, m.u(n_used)), m.u(slot)), previous[1])
    return f.kernel(f"moe_select_{n_expert}_{n_used}{'_biased' if biased else ''}")


def _after(fn: Function, score: int, expert: int, prev_score: int, prev_expert: int) -> int:
    """Whether (score, expert) comes after (prev_score, prev_expert) in the descending sort: a lower
    score, or an equal one of a higher expert."""
    lower = fn.fcmp(Op.FOrdLessThan, score, prev_score)
    tied = fn.logical_and(fn.fcmp(Op.FOrdEqual, score, prev_score), fn.icmp(Op.UGreaterThan, expert, prev_expert))
    return fn.logical_or(lower, tied)


def render_route_weights(n_expert: int, n_used: int, normalize: bool, scale: float) -> Kernel:
    """weights f32 [rows, n_used]: probs[row, ids[row, j]], divided by their sum when `normalize`,
    times `scale` unless 0 or 1. Bindings: probs f32 [rows, E], ids u32 [rows, n_used], weights;
    push constant: rows."""
    f = frame(("probs", "f32"), ("ids", "u32"), ("weights", "f32"), workgroup=ROW_WORKGROUP)
    m, fn, (probs, ids, out), params = f.m, f.fn, f.buffers, f.params
    f64 = m.float_(64)
    row, in_range = _each_row(fn, params)
    with in_range:
        slots = [fn.iadd(fn.imul(row, m.u(n_used)), m.u(j)) for j in range(n_used)]
        w = [fn.buf_load(probs, fn.iadd(fn.imul(row, m.u(n_expert)), fn.buf_load(ids, s))) for s in slots]
        if normalize:
            first = fn.convert(w[0], f64)  # 0 + w_0: w_0 with a zero made +0 (a driver may fold the add)
            total = fn.select(fn.fcmp(Op.FOrdEqual, first, m.const(f64, 0.0)), m.const(f64, 0.0), first)
            for v in w[1:]:
                total = fn.fadd(total, fn.convert(v, f64))
            total = fn.convert(total, m.f32)
            floor = m.f(float(WEIGHT_SUM_FLOOR))
            total = fn.select(fn.fcmp(Op.FOrdLessThan, total, floor), floor, total)
            w = [fn.fdiv(v, total) for v in w]
        if scale not in (0.0, 1.0):
            w = [fn.fmul(v, m.f(scale)) for v in w]
        for s, v in zip(slots, w, strict=True):
            fn.buf_store(out, s, v)
    return f.kernel(f"moe_weights_{n_expert}_{n_used}_{int(normalize)}_{scale!r}")


def render_weighted_sum(n_used: int, width: int) -> Kernel:
    """out f32 [rows, width] = sum over slots j in order of y[row, j, :] * weights[row, j]. Bindings:
    y f32 [rows, n_used * width], weights f32 [rows, n_used], out; push constant: rows."""
    f = frame(("y", "f32"), ("weights", "f32"), ("out", "f32"), workgroup=WORKGROUP)
    m, fn, (y, weights, out) = f.m, f.fn, f.buffers
    i = flat_index(fn, WORKGROUP)
    with fn.if_(fn.icmp(Op.ULessThan, i, fn.imul(f.push(), m.u(width)))):
        row, col = fn.udiv(i, m.u(width)), fn.umod(i, m.u(width))
        total = None
        for j in range(n_used):
            slot = fn.iadd(fn.imul(row, m.u(n_used)), m.u(j))
            value = fn.buf_load(y, fn.iadd(fn.imul(slot, m.u(width)), col))
            product = fn.fmul(value, fn.buf_load(weights, slot))
            total = product if total is None else fn.fadd(total, product)
        fn.buf_store(out, i, total)
    return f.kernel(f"moe_sum_{n_used}_{width}")
