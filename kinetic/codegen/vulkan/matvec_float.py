"""Matrix-vector products for float weights (F16, BF16) on Vulkan, in the order of `numerics/dots.py`'s
`float_dot` (ggml_vec_dot_f16 / ggml_vec_dot_bf16 as the reference builds them), reading f32 rows.

Owns: `render_matvec_float`, and the frame matvec_f32.py shares (bindings, layout, lanes, store).
Does not own the dispatch (ops.py: no quantizer runs before it, the activations are rounded here),
the weights' upload (ops.py / model.py) or the meaning (numerics).

A float weight meets activations rounded to its own type (QUANT_TYPES' activation): each invocation
rounds the values it reads, by integer operations (F16: builders.f32_to_f16_bits, half to even,
overflow to infinity, as numpy's astype; BF16: ggml_compute_fp32_to_bf16, half to even, a NaN kept
quiet). Then float_dot's order:

* F16: 64 float lanes per output, lane i summing x*w over values 64c + i of the chunks c in order (a
  product of two f16 values is exact in f32, so the add rounds once, as the reference's fma does);
  t16[i] = (lane i + lane 32 + i) + (lane 16 + i + lane 48 + i), then reduce16(t16).
* BF16 (vdpbf16ps): 32 lanes, lane i = 16v + l taking values 64c + 32v + 2l + 1 and then
  64c + 32v + 2l of each chunk, each step an fma (builders.fma: rounded once) whose bf16 inputs and
  f32 result have their subnormals flushed to signed zeros; s_v = reduce16(lanes 16v ..), and the
  sum is (0 + s_0) + s_1 in float64.

reduce16 is _mm512_reduce_add_ps: v8[i] = v[8 + i] + v[i], v4[i] = v8[4 + i] + v8[i], then
(v4[0] + v4[2]) + (v4[1] + v4[3]). The K % 64 last values are added one by one in float64 (their f32
products, neither operand flushed), rounded to f32 at the end.

Layout: a workgroup of 4 outputs x 32 invocations. F16: invocation t holds lanes t and t + 32, so
its own add is t16's inner pair; BF16: invocation t is lane t. The lanes go through shared memory
and the output's first invocation sums them in the order above. Workgroups: (ceil(n_out / 4), rows).
Rows never mix and nothing depends on the number of rows, so a row in a batch is bit-identical to
the row alone. Float64 is needed for BF16 and for a tail (K not a multiple of 64).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.vulkan import builders
from kinetic.codegen.vulkan.builders import Target
from kinetic.codegen.vulkan.device import Kernel, Unsupported
from kinetic.codegen.vulkan.matvec import expert_row
from kinetic.codegen.vulkan.spirv import GLSL, BuiltIn, Function, Module, Op
from kinetic.ir.numerics.dots import FLOAT_CHUNK

SUPPORTED = (Q.F16, Q.BF16)
OUTPUTS_PER_GROUP = 4
INVOCATIONS = 32  # per output
WORKGROUP = OUTPUTS_PER_GROUP * INVOCATIONS


def _half(fn: Function, words, element: int) -> int:
    """The 16 bits of element `element` (a u32 id) of a 16-bit array stored in u32 words, as u32."""
    m = fn.m
    word = fn.buf_load(words, fn.shr(element, m.u(1)))
    return fn.bits_u(word, None, 16, offset_id=fn.shl(fn.band(element, m.u(1)), m.u(4)))


def _weight(fn: Function, wtype: Q, words, element: int) -> int:
    """Weight element `element` as f32 (f16 by integer operations; bf16 the top half of an f32)."""
    bits = _half(fn, words, element)
    if wtype is Q.F16:
        return builders.f16_bits_to_f32(fn, bits)
    return fn.bitcast(fn.shl(bits, fn.m.u(16)), fn.m.f32)


def _rounded(fn: Function, wtype: Q, value: int) -> int:
    """An f32 activation rounded to the weight's type (half to even), as f32."""
    m = fn.m
    if wtype is Q.F16:
        return builders.f16_bits_to_f32(fn, builders.f32_to_f16_bits(fn, value))
    bits = fn.bitcast(value, m.u32)
    odd = fn.band(fn.shr(bits, m.u(16)), m.u(1))
    rounded = fn.band(fn.iadd(bits, fn.iadd(m.u(0x7FFF), odd)), m.u(0xFFFF0000))
    quiet = fn.bor(fn.band(bits, m.u(0xFFFF0000)), m.u(0x400000))
    nan = fn.icmp(Op.UGreaterThan, fn.band(bits, m.u(0x7FFFFFFF)), m.u(0x7F800000))
    return fn.bitcast(fn.select(nan, quiet, rounded), m.f32)


def _flush(fn: Function, value: int) -> int:
    """value with a subnormal replaced by the zero of its sign (by its bits, whatever the device does
    with subnormals)."""
    m = fn.m
    bits = fn.bitcast(value, m.u32)
    tiny = fn.icmp(Op.IEqual, fn.band(bits, m.u(0x7F800000)), m.u(0))
    return fn.bitcast(fn.select(tiny, fn.band(bits, m.u(0x80000000)), bits), m.f32)


def reduce16(fn: Function, v: list[int]) -> int:
    """_mm512_reduce_add_ps over 16 values (see the module docstring)."""
    while len(v) > 4:
        half = len(v) // 2
        v = [fn.fadd(v[half + i], v[i]) for i in range(half)]
    return fn.fadd(fn.fadd(v[0], v[2]), fn.fadd(v[1], v[3]))


def render_matvec_float(t: Target, wtype: Q, n_out: int, k: int, f64: bool, experts: bool = False) -> Kernel:
    """Bindings: weights u32 (16-bit pairs) [n_out*K/2], x f32 [rows*K], y f32 [rows*n_out] (with
    `experts`, expert_ids u32 [rows]: open_frame). `f64`: the device has float64 (BF16 and any K % 64
    tail need it)."""
    if wtype not in SUPPORTED:
        raise Unsupported(f"{wtype.name} is not a float weight type with a Vulkan kernel")
    if k % 2:
        raise Unsupported(f"matvec: {wtype.name} rows of {k} values (an odd count) have no Vulkan kernel")
    main = k - k % FLOAT_CHUNK
    if (main != k or wtype is Q.BF16) and not f64:
        raise Unsupported(f"matvec: {wtype.name} rows of {k} values need float64 (this device has none)")
    frame = open_frame(n_out, k, weight_type="u32", experts=experts)
    fn, m, rows = frame.fn, frame.m, frame.rows
    lanes = _f16_lanes if wtype is Q.F16 else _bf16_lanes
    with first_invocation(frame, n_out, lanes(fn, t, frame.weights, frame.x, rows, frame.lane, main)) as held:
        f64_t = m.float_(64) if f64 else None
        if wtype is Q.F16:
            total = reduce16(fn, [fn.fadd(held[i], held[16 + i]) for i in range(16)])
            start = fn.convert(total, f64_t) if main != k else None
        else:
            sums = [fn.convert(reduce16(fn, held[16 * v : 16 * v + 16]), f64_t) for v in range(2)]
            zero = m.const(f64_t, 0.0)  # 0 + s_0 is s_0 with a zero made +0 (a driver may fold the add)
            start = fn.fadd(fn.select(fn.fcmp(Op.FOrdEqual, sums[0], zero), zero, sums[0]), sums[1])
        if start is not None:
            total = fn.convert(_tail(fn, wtype, frame.weights, frame.x, rows, start, main, k), m.f32)
        store_output(frame, n_out, total)
    return close_frame(frame, f"matvec_{wtype.name.lower()}_{n_out}x{k}{'_experts' if experts else ''}")


@dataclass(frozen=True)
class Frame:
    """The layout both float-weight matvecs share (module docstring): bindings weights, x, y; the
    shared lanes; this invocation's lane and output; `rows`: the ids of its first weight and first
    activation."""

    m: Module
    fn: Function
    weights: int
    x: int
    y: int
    scratch: int
    own_slot: int  # this invocation's place in the shared lanes
    lane: int
    local_out: int
    row_x: int
    n: int
    rows: tuple[int, int]
    experts: bool = False  # a fourth binding, expert_ids u32 [rows] (matvec.expert_row)


def open_frame(n_out: int, k: int, *, weight_type: str, experts: bool = False) -> Frame:
    """The module, its bindings (weights of element type `weight_type`: "u32" or "f32", x f32, y f32;
    with `experts`, expert_ids u32 [rows], the weights a stack of [E, n_out] rows) and the
    invocation's place: output n (past n_out it reads the last row and stores nothing)."""
    m = Module()
    weights = m.storage_buffer(0, getattr(m, weight_type), readonly=True, name="weights")
    x = m.storage_buffer(1, m.f32, readonly=True, name="x")
    y = m.storage_buffer(2, m.f32, name="y")
    ids = m.storage_buffer(3, m.u32, readonly=True, name="expert_ids") if experts else None
    scratch = m.shared_array(m.f32, WORKGROUP, "lanes")
    fn = m.compute_entry((WORKGROUP, 1, 1))
    index = fn.builtin(BuiltIn.LocalInvocationIndex)
    lane, local_out = fn.band(index, m.u(INVOCATIONS - 1)), fn.shr(index, m.u(5))
    wg = fn.builtin(BuiltIn.WorkgroupId)
    row_x = fn.emit(Op.CompositeExtract, m.u32, wg, 1)
    n = fn.iadd(fn.imul(fn.emit(Op.CompositeExtract, m.u32, wg, 0), m.u(OUTPUTS_PER_GROUP)), local_out)
    n_read = fn.glsl2(GLSL.UMin, n, m.u(n_out - 1))  # past n_out: read the last row, store nothing
    n_read = expert_row(fn, n_read, row_x, n_out, ids)
    rows = (fn.imul(n_read, m.u(k)), fn.imul(row_x, m.u(k)))  # first weight, first activation
    own_slot = fn.shared_ptr(scratch, index)
    return Frame(m, fn, weights, x, y, scratch, own_slot, lane, local_out, row_x, n, rows, experts)


@contextmanager
def first_invocation(frame: Frame, n_out: int, own: int) -> Iterator[list[int]]:
    """Stores this invocation's value `own` in the shared lanes; in the block, the output's first
    invocation (of an output below n_out) holds its 32 invocations' values, in order."""
    fn, m = frame.fn, frame.m
    fn.store(frame.own_slot, own)
    fn.workgroup_barrier()
    first = fn.logical_and(fn.icmp(Op.IEqual, frame.lane, m.u(0)), fn.icmp(Op.ULessThan, frame.n, m.u(n_out)))
    with fn.if_(first):
        base = fn.imul(frame.local_out, m.u(INVOCATIONS))
        yield [fn.load(fn.shared_ptr(frame.scratch, fn.iadd(base, m.u(i)))) for i in range(INVOCATIONS)]


def store_output(frame: Frame, n_out: int, total: int) -> None:
    """y[row, n] = total."""
    fn = frame.fn
    fn.buf_store(frame.y, fn.iadd(fn.imul(frame.row_x, frame.m.u(n_out)), frame.n), total)


def close_frame(frame: Frame, name: str) -> Kernel:
    """The finished kernel `name`."""
    frame.fn.end()
    readonly = (True, True, False) + ((True,) if frame.experts else ())
    return Kernel(name, frame.m.to_bytes(), readonly, (WORKGROUP, 1, 1))


def _f16_lanes(fn: Function, t: Target, words, x, rows, lane: int, main: int) -> int:
    """F16: this invocation's lanes `lane` and `lane` + 32 over the chunks, added (t16's inner pair)."""
    m = fn.m
    accs = fn.local(m.f32, m.f(0.0)), fn.local(m.f32, m.f(0.0))
    with fn.loop(m.u(0), m.u(main), FLOAT_CHUNK) as c:
        for acc, offset in zip(accs, (0, 32), strict=True):
            at = fn.iadd(c, fn.iadd(lane, m.u(offset)))
            xv = _rounded(fn, Q.F16, fn.buf_load(x, fn.iadd(rows[1], at)))
            product = fn.fmul(xv, _weight(fn, Q.F16, words, fn.iadd(rows[0], at)))
            fn.store(acc, builders.add(fn, product, fn.load(acc)))
    return fn.fadd(fn.load(accs[0]), fn.load(accs[1]))


def _bf16_lanes(fn: Function, t: Target, words, x, rows, lane: int, main: int) -> int:
    """BF16: lane `lane` over the chunks, values 2l + 1 then 2l of its 32, flushed fmas."""
    m = fn.m
    acc = fn.local(m.f32, m.f(0.0))
    with fn.loop(m.u(0), m.u(main), FLOAT_CHUNK) as c:
        at = fn.iadd(c, fn.imul(lane, m.u(2)))
        for pos in (1, 0):
            element = fn.iadd(at, m.u(pos))
            xv = _flush(fn, _rounded(fn, Q.BF16, fn.buf_load(x, fn.iadd(rows[1], element))))
            wv = _flush(fn, _weight(fn, Q.BF16, words, fn.iadd(rows[0], element)))
            fn.store(acc, _flush(fn, builders.fma(fn, t, xv, wv, fn.load(acc))))
    return fn.load(acc)


def _tail(fn: Function, wtype: Q, words, x, rows, start: int, main: int, k: int) -> int:
    """The float64 sum `start` plus the f32 products of values main .. k - 1, in order."""
    m = fn.m
    sumf = fn.local(m.float_(64), start)
    with fn.loop(m.u(main), m.u(k)) as i:
        xv = _rounded(fn, wtype, fn.buf_load(x, fn.iadd(rows[1], i)))
        product = fn.fmul(xv, _weight(fn, wtype, words, fn.iadd(rows[0], i)))
        fn.store(sumf, fn.fadd(fn.load(sumf), fn.convert(product, m.float_(64))))
    return fn.load(sumf)
