"""Building blocks the Vulkan kernel renderers share: a fused multiply-add that rounds once on every
device, f16 <-> f32 by integer operations, unaligned loads from word buffers, and a workgroup sum
whose order is fixed by the workgroup size alone.

Owns: the arithmetic whose exactness does not depend on the driver. Vulkan lets a driver compute
`Fma` as a multiply and an add (lavapipe does; `device.probe_fused_fma` measures it), and leaves the
rounding of float conversions and of subgroup reductions to the implementation; the helpers here
spell each of those out so a kernel's result is the one its docstring states. Does not own kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from kinetic.codegen.vulkan.spirv import GLSL, BuiltIn, Function, Op, Shared

FMA_MODES = ("fused", "f64", "unfused")


@dataclass(frozen=True)
class Target:
    """What a renderer needs to know of the device: its subgroup size and shuffle support, and how
    an fma that rounds once is formed there (`fused`: the device's Fma instruction; `f64`: an exact
    float64 product and sum, then a correctly rounded conversion; `unfused`: neither is available,
    so a multiply and an add, rounding twice: such a device matches the reference only within a
    tolerance)."""

    subgroup_size: int
    shuffle: bool
    fma_mode: str

    @staticmethod
    def of(caps, fma_fused: bool) -> Target:
        mode = "fused" if fma_fused else "f64" if caps.shader_float64 else "unfused"
        return Target(caps.subgroup_size, caps.has_subgroup("basic", "shuffle"), mode)


def fma(fn: Function, t: Target, a: int, b: int, c: int) -> int:
    """a*b + c for f32 operands, rounded once (IEEE fma) when t.fma_mode is fused or f64; a zero
    product plus a zero c is IEEE's signed zero (_zeros_added)."""
    if t.fma_mode == "fused":
        r = fn.fma(a, b, c)
    elif t.fma_mode == "unfused":
        r = fn.fadd(fn.fmul(a, b), c)
    else:
        r = _fma_via_f64(fn, a, b, c)
    m = fn.m
    finite = [fn.fcmp(Op.FOrdLessThan, fn.glsl1(GLSL.FAbs, v), m.f(float("inf"))) for v in (a, b)]
    zero = [fn.fcmp(Op.FOrdEqual, v, m.f(0.0)) for v in (a, b)]
    product_is_zero = fn.logical_or(fn.logical_and(zero[0], finite[1]), fn.logical_and(zero[1], finite[0]))
    return _zeros_added(fn, r, product_is_zero, fn.bxor(_sign_bit(fn, a), _sign_bit(fn, b)), c)


def add(fn: Function, a: int, b: int) -> int:
    """a + b for f32 operands, a sum of two zeros IEEE's signed zero (_zeros_added)."""
    return _zeros_added(fn, fn.fadd(a, b), fn.fcmp(Op.FOrdEqual, a, fn.m.f(0.0)), _sign_bit(fn, a), b)


def _sign_bit(fn: Function, v: int) -> int:
    """The sign bit of an f32, as a u32 (0 or 0x80000000)."""
    return fn.band(fn.bitcast(v, fn.m.u32), fn.m.u(0x80000000))


def _zeros_added(fn: Function, r: int, x_is_zero: int, x_sign: int, y: int) -> int:
    """r = x + y as the device computed it, except that a zero x plus a zero y is +0 unless both are
    -0 (IEEE, round to nearest). Mesa 22.3's NIR folds `a + 0.0` into a and `fma(a, b, 0.0)` into
    a*b whatever the decorations and float controls say, so an accumulator that starts at +0.0 in a
    loop the driver unrolls kept a -0 first term; the sign is chosen here from the operands' bits,
    which no folding can change."""
    m = fn.m
    both_zero = fn.logical_and(x_is_zero, fn.fcmp(Op.FOrdEqual, y, m.f(0.0)))
    signed = fn.bitcast(fn.band(x_sign, _sign_bit(fn, y)), m.f32)
    return fn.select(both_zero, signed, r)


def _fma_via_f64(fn: Function, a: int, b: int, c: int) -> int:
    """The exact product a*b (48 bits fit a double) plus c in float64, corrected where rounding the
    double to float32 would round twice: when the double lies exactly halfway between two floats
    and the double sum was inexact, the true sum lies on the side of the sum's error (TwoSum), so
    step the float one ulp that way; an overflow is infinity unless the double is exactly the
    overflow edge with the error pointing back. This is `kinetic.ir.numerics.fma_f32`, in SPIR-V."""
    m = fn.m
    f64 = m.float_(64)
    p = fn.fmul(fn.convert(a, f64), fn.convert(b, f64))
    c64 = fn.convert(c, f64)
    s = fn.fadd(p, c64)
    bb = fn.fsub(s, p)
    err = fn.fadd(fn.fsub(p, fn.fsub(s, bb)), fn.fsub(c64, bb))  # TwoSum: s + err == p + c64 exactly
    r = fn.convert(s, m.f32)
    d = fn.fsub(s, fn.convert(r, f64))  # exact: how far the float is from the double
    zero64 = m.const(f64, 0.0)
    up = fn.fcmp(Op.FOrdGreaterThan, d, zero64)
    toward = next_float(fn, r, up)
    gap = fn.glsl1(GLSL.FAbs, fn.fsub(fn.convert(toward, f64), fn.convert(r, f64)))
    tie = fn.fcmp(Op.FOrdEqual, fn.fmul(fn.glsl1(GLSL.FAbs, d), m.const(f64, 2.0)), gap)
    tie = fn.logical_and(tie, fn.fcmp(Op.FUnordNotEqual, d, zero64))
    # an overflow to infinity is no tie (d and the gap are both infinite there)
    finite = fn.icmp(Op.INotEqual, fn.band(fn.bitcast(r, m.u32), m.u(0x7F800000)), m.u(0x7F800000))
    tie = fn.logical_and(tie, finite)
    err_up = fn.fcmp(Op.FOrdGreaterThan, err, zero64)
    inexact = fn.fcmp(Op.FUnordNotEqual, err, zero64)
    same_side = fn.logical_and(inexact, fn.logical_eq(err_up, up))
    rounded = fn.select(fn.logical_and(tie, same_side), toward, r)
    # past FLT_MAX the midpoint is the overflow edge FLT_MAX + half an ulp: a double exactly on it
    # rounds to infinity, but the true sum is below it (FLT_MAX) when the error points back
    on_edge = fn.fcmp(Op.FOrdEqual, fn.glsl1(GLSL.FAbs, s), m.const(f64, float.fromhex("0x1.ffffffp+127")))
    back = fn.logical_and(inexact, fn.logical_not(fn.logical_eq(err_up, fn.fcmp(Op.FOrdGreaterThan, s, zero64))))
    largest = fn.bitcast(fn.bor(fn.band(fn.bitcast(r, m.u32), m.u(0x80000000)), m.u(0x7F7FFFFF)), m.f32)
    return fn.select(fn.logical_and(on_edge, back), largest, rounded)


def next_float(fn: Function, r: int, up: int) -> int:
    """The f32 next to r toward +inf when `up` (a bool id) holds, toward -inf otherwise."""
    m = fn.m
    bits = fn.bitcast(r, m.u32)
    positive = fn.icmp(Op.IEqual, fn.shr(bits, m.u(31)), m.u(0))
    is_zero = fn.icmp(Op.IEqual, fn.band(bits, m.u(0x7FFFFFFF)), m.u(0))
    grow = fn.logical_eq(positive, up)  # away from zero
    stepped = fn.select(grow, fn.iadd(bits, m.u(1)), fn.isub(bits, m.u(1)))
    smallest = fn.select(up, m.u(1), m.u(0x80000001))
    return fn.bitcast(fn.select(is_zero, smallest, stepped), m.f32)


def f16_bits_to_f32(fn: Function, h: int) -> int:
    """An f16 bit pattern (u32, low 16 bits) as f32, exactly: normal numbers by moving the fields,
    subnormals as mantissa * 2^-24 (exact), infinities and NaNs kept."""
    m = fn.m
    sign = fn.shl(fn.band(h, m.u(0x8000)), m.u(16))
    exp = fn.bits_u(h, 10, 5)
    mant = fn.band(h, m.u(0x3FF))
    normal = fn.bor(fn.shl(fn.iadd(exp, m.u(112)), m.u(23)), fn.shl(mant, m.u(13)))
    special = fn.bor(m.u(0x7F800000), fn.shl(mant, m.u(13)))
    sub = fn.bitcast(fn.fmul(fn.convert(mant, m.f32), m.f(2.0**-24)), m.u32)
    bits = fn.select(fn.icmp(Op.IEqual, exp, m.u(0)), sub,
                     fn.select(fn.icmp(Op.IEqual, exp, m.u(31)), special, normal))
    return fn.bitcast(fn.bor(bits, sign), m.f32)


def f32_to_f16_bits(fn: Function, x: int) -> int:
    """f32 -> f16 bit pattern (u32) rounded to nearest even, as vcvtps2ph and numpy do: overflow to
    infinity, f16 subnormals by RoundEven(|x| * 2^24) (exact scaling), NaN kept quiet."""
    m = fn.m
    bits = fn.bitcast(x, m.u32)
    sign = fn.band(fn.shr(bits, m.u(16)), m.u(0x8000))
    mag = fn.band(bits, m.u(0x7FFFFFFF))
    # normal f16 range: rebias the exponent (127 -> 15) and round the 13 dropped bits half to even;
    # a carry out of the mantissa correctly bumps the exponent (up to infinity)
    lsb = fn.band(fn.shr(mag, m.u(13)), m.u(1))
    normal = fn.shr(fn.iadd(fn.isub(mag, m.u(0x38000000)), fn.iadd(m.u(0xFFF), lsb)), m.u(13))
    absx = fn.bitcast(mag, m.f32)
    sub = fn.convert(fn.glsl1(GLSL.RoundEven, fn.fmul(absx, m.f(2.0**24))), m.u32)
    h = fn.select(fn.icmp(Op.ULessThan, mag, m.u(0x38800000)), sub, normal)  # below 2^-14: subnormal
    h = fn.select(fn.icmp(Op.UGreaterThanEqual, mag, m.u(0x477FF000)), m.u(0x7C00), h)  # rounds to inf
    h = fn.select(fn.icmp(Op.UGreaterThan, mag, m.u(0x7F800000)), m.u(0x7E00), h)  # NaN
    return fn.bor(h, sign)


def load_u32_at(fn: Function, words, byte_offset: int) -> int:
    """The 4 bytes at an even byte offset of a u32 buffer (little-endian), aligned or not: ggml's
    blocks are 2-byte aligned (Q8_0 is 34 bytes), so a field may straddle two words."""
    m = fn.m
    index = fn.shr(byte_offset, m.u(2))
    lo = fn.buf_load(words, index)
    hi = fn.buf_load(words, fn.iadd(index, m.u(1)))
    shift = fn.shl(fn.band(byte_offset, m.u(3)), m.u(3))
    joined = fn.bor(fn.shr(lo, shift), fn.shl(hi, fn.isub(m.u(32), shift)))
    return fn.select(fn.icmp(Op.IEqual, shift, m.u(0)), lo, joined)


def load_u16_at(fn: Function, words, byte_offset: int) -> int:
    """The 2 bytes at an even byte offset of a u32 buffer, as a u32."""
    m = fn.m
    word = fn.buf_load(words, fn.shr(byte_offset, m.u(2)))
    return fn.bits_u(word, None, 16, offset_id=fn.shl(fn.band(byte_offset, m.u(2)), m.u(3)))


def tree_sum(fn: Function, values: list[int]) -> int:
    """The pairwise sum of values in index order: (v0+v1) + (v2+v3) ..., each level pairing
    neighbours; the tree every workgroup_sum follows."""
    while len(values) > 1:
        values = [fn.fadd(values[i], values[i + 1]) for i in range(0, len(values), 2)]
    return values[0]


def workgroup_sum(fn: Function, t: Target, scratch: Shared, sub_scratch: Shared, value: int, width: int) -> int:
    """The sum of `value` over the `width` invocations of a 1-D workgroup, in a fixed order: the
    pairwise tree over local invocation indices 0..width-1 (neighbours first, as tree_sum), the same
    on every device whatever its subgroup size. Every invocation gets the result.

    The values go through shared memory indexed by LocalInvocationIndex, so which invocation sits in
    which subgroup lane does not matter; each subgroup then reads an aligned run of them and sums it
    by an xor butterfly (masks 1, 2, 4, ...: lane i meets i^1, then i^2, ... , which is the pairwise
    tree; addition is commutative, so all lanes agree), and the subgroup totals are summed by the same
    tree. Without shuffles (or with subgroups wider than the workgroup) the whole tree runs on
    shared memory."""
    m = fn.m
    index = fn.builtin(BuiltIn.LocalInvocationIndex)
    fn.store(fn.shared_ptr(scratch, index), value)
    fn.workgroup_barrier()
    size = t.subgroup_size if t.shuffle and t.subgroup_size <= width else 1
    if size == 1:
        total = tree_sum(fn, [fn.load(fn.shared_ptr(scratch, m.u(i))) for i in range(width)])
        fn.workgroup_barrier()
        return total
    lane = fn.builtin(BuiltIn.SubgroupLocalInvocationId)
    group = fn.builtin(BuiltIn.SubgroupId)
    v = fn.load(fn.shared_ptr(scratch, fn.iadd(fn.imul(group, m.u(size)), lane)))
    mask = 1
    while mask < size:
        v = fn.fadd(v, fn.shuffle_xor(v, mask))
        mask *= 2
    with fn.if_(fn.icmp(Op.IEqual, lane, m.u(0))):
        fn.store(fn.shared_ptr(sub_scratch, group), v)
    fn.workgroup_barrier()
    total = tree_sum(fn, [fn.load(fn.shared_ptr(sub_scratch, m.u(i))) for i in range(width // size)])
    fn.workgroup_barrier()  # the scratch may be reused right after
    return total
