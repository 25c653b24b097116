"""Quantized matrix-vector products for block-32 weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL), in ggml's
order.

Two kernels, recorded back to back in one command buffer (a barrier between them):

1. `render_quantize_q8`: one invocation per block of 32 activations, `numerics.quantize_q8_0` /
   `q8_1_sums`: amax = max |x|, d = amax / 127, q = RoundEven(x * (127 / amax)), d stored as its f16
   value, and for Q8_1 s = f16(d * sum q) with d unrounded. Quants are packed 4 to a word.
2. `render_matvec`: one workgroup of 64 invocations per 8 weight rows of one activation row;
   invocation (row n, lane l) walks the blocks of row n in order; its integer part of each block is
   the exact dot of values 4l .. 4l+3. Then the reference's float order for the type (`dot_order`):

   "lanes" (ggml's vec-dots: Q8_0, Q4_1, Q5_0, Q5_1, and Q4_0 where the reference keeps it there):
       acc_l = fma(d_w * d_x, float(isum_l), acc_l)
       summs = summs + m_w * s_x                                       (Q4_1 and Q5_1 only)
       y[n] = ((acc0+acc4) + (acc2+acc6)) + ((acc1+acc5) + (acc3+acc7)) (+ summs)
     the final sum is a subgroup xor butterfly with masks 4, 2, 1 over the 8 lanes;
   "scalar" (the repacked gemv llama.cpp runs for Q4_0 and IQ4_NL on x86, where the reference
   follows it; IQ4_NL is Q4_0's layout with its nibbles read through the IQ4_NL codebook):
       isum = isum_0 + ... + isum_7 (exact; a butterfly of integer shuffles), then in every lane
       acc = fma(float(isum), d_x * d_w, acc);  y[n] = acc.
   Where the subgroup is narrower than 8 or has no shuffles, the same sums go through shared memory.

This is `numerics.matmul` operation for operation, so with an fma that rounds once
(builders.fma) the result is the reference bit for bit, except that the reference forms its fma in
float64 and rounds twice where a double lands exactly between two floats (docs/numerics.md); and the
quantizer's two divisions, exact on lavapipe, may be 2.5 ulp off on other devices, which can move
a quant by one. Rows never mix, and nothing depends on the number of rows: a row computed in a batch
is bit-identical to the row alone.
Weights are read as u32 words (no 8- or 16-bit storage needed); blocks are 2-byte aligned, so a
field may straddle two words (builders.load_u32_at).
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.vulkan import builders
from kinetic.codegen.vulkan.builders import Target
from kinetic.codegen.vulkan.device import Kernel, Unsupported
from kinetic.codegen.vulkan.elementwise import flat_index
from kinetic.codegen.vulkan.spirv import GLSL, BuiltIn, Function, Module, Op
from kinetic.ir.quants import QUANT_TYPES

# weight type -> byte offset of the quants in its block (block bytes, activation format and dot order
# are QUANT_TYPES')
QS_OFFSET = {Q.Q8_0: 2, Q.Q4_0: 2, Q.Q4_1: 4, Q.Q5_0: 6, Q.Q5_1: 8, Q.IQ4_NL: 2}
# 5-bit types -> byte offset of their 32 high bits (bit v is value v's 5th bit) and the offset their
# unsigned quants carry (Q5_0: q - 16; Q5_1: q, its minimum m_w added through the Q8_1 sums)
QH_OFFSET = {Q.Q5_0: (2, 16), Q.Q5_1: (4, 0)}
SUPPORTED = tuple(QS_OFFSET)
ROWS_PER_GROUP = 8
LANES = 8
QUANT_WORKGROUP = 64


def dot_order(wtype: Q) -> str:
    """The float order the reference uses for this weight type: "lanes" or "scalar" (see above)."""
    order = QUANT_TYPES[wtype].dot_order if wtype in QUANT_TYPES else None
    if order not in ("lanes", "scalar"):
        raise Unsupported(f"{wtype.name}: the reference's dot order is neither ggml's lanes nor the scalar gemv")
    return order


def render_quantize_q8(with_sums: bool) -> Kernel:
    """Bindings: x f32 [rows*K], q u32 [rows*K/4], d f32 [rows*K/32], s f32 [rows*K/32] (Q8_1 only).
    Push constant: the number of blocks (rows*K/32)."""
    m = Module()
    x = m.storage_buffer(0, m.f32, readonly=True, name="x")
    q_out = m.storage_buffer(1, m.u32, name="q")
    d_out = m.storage_buffer(2, m.f32, name="d")
    s_out = m.storage_buffer(3, m.f32, name="s") if with_sums else None
    params, _ = m.push_constants([m.u32])
    fn = m.compute_entry((QUANT_WORKGROUP, 1, 1))
    block = flat_index(fn, QUANT_WORKGROUP)
    with fn.if_(fn.icmp(Op.ULessThan, block, fn.push(params, 0, m.u32))):
        base = fn.imul(block, m.u(32))
        xs = [fn.buf_load(x, fn.iadd(base, m.u(i))) for i in range(32)]
        amax = m.f(0.0)
        for v in xs:  # max is exact in any order
            amax = fn.glsl2(GLSL.FMax, amax, fn.glsl1(GLSL.FAbs, v))
        d = fn.fdiv(amax, m.f(127.0))
        nonzero = fn.fcmp(Op.FUnordNotEqual, amax, m.f(0.0))
        inv = fn.select(nonzero, fn.fdiv(m.f(127.0), amax), m.f(0.0))
        qs = [fn.convert(fn.glsl1(GLSL.RoundEven, fn.fmul(v, inv)), m.i32) for v in xs]
        for w in range(8):
            word = m.u(0)
            for i in range(4):
                byte = fn.band(fn.bitcast(qs[4 * w + i], m.u32), m.u(0xFF))
                word = fn.bor(word, fn.shl(byte, m.u(8 * i)))
            fn.buf_store(q_out, fn.iadd(fn.imul(block, m.u(8)), m.u(w)), word)
        fn.buf_store(d_out, block, round_f16(fn, d))
        if with_sums:
            total = qs[0]
            for v in qs[1:]:
                total = fn.iadd(total, v)
            fn.buf_store(s_out, block, round_f16(fn, fn.fmul(d, fn.convert(total, m.f32))))
    fn.end()
    readonly = (True, False, False) + ((False,) if with_sums else ())
    return Kernel("quantize_q8_1" if with_sums else "quantize_q8_0", m.to_bytes(), readonly,
                  (QUANT_WORKGROUP, 1, 1), push_size=4)


def round_f16(fn: Function, v: int) -> int:
    """v rounded to the nearest f16 (half to even), as f32."""
    return builders.f16_bits_to_f32(fn, builders.f32_to_f16_bits(fn, v))


def _weight_quads(fn: Function, wtype: Q, words, block_base: int, lane: int) -> list[int]:
    """The 4 integer weights (i32 ids) of values 4*lane .. 4*lane+3 of the block at block_base."""
    m = fn.m
    qs_at = QS_OFFSET[wtype]
    if wtype is Q.Q8_0:
        word = builders.load_u32_at(fn, words, fn.iadd(block_base, fn.iadd(m.u(qs_at), fn.imul(lane, m.u(4)))))
        signed = fn.bitcast(word, m.i32)
        return [fn.bits_s(signed, 8 * i, 8) for i in range(4)]
    # 4-bit layouts: values 0..15 are the low nibbles of bytes 0..15, values 16..31 the high ones
    byte = fn.iadd(block_base, fn.iadd(m.u(qs_at), fn.imul(fn.band(lane, m.u(3)), m.u(4))))
    word = builders.load_u32_at(fn, words, byte)
    nibble_shift = fn.imul(fn.shr(lane, m.u(2)), m.u(4))
    nibbles = [fn.bits_u(word, None, 4, offset_id=fn.iadd(m.u(8 * i), nibble_shift)) for i in range(4)]
    if wtype is Q.Q4_1:
        return [fn.bitcast(v, m.i32) for v in nibbles]
    if wtype is Q.Q4_0:
        return [fn.isub(fn.bitcast(v, m.i32), m.i(8)) for v in nibbles]
    if wtype is Q.IQ4_NL:
        return [_codebook(fn, QUANT_TYPES[wtype].codebook, v) for v in nibbles]
    qh_at, offset = QH_OFFSET[wtype]
    qh = builders.load_u32_at(fn, words, fn.iadd(block_base, m.u(qh_at)))
    out = []
    for i in range(4):
        high = fn.bits_u(qh, None, 1, offset_id=fn.iadd(fn.imul(lane, m.u(4)), m.u(i)))
        q = fn.bitcast(fn.bor(nibbles[i], fn.shl(high, m.u(4))), m.i32)
        out.append(fn.isub(q, m.i(offset)) if offset else q)
    return out


def _codebook(fn: Function, values: tuple[int, ...], nibble: int) -> int:
    """values[nibble] (16 signed bytes) as i32: the bytes packed 4 to a word, the word picked by
    nibble >> 2, the byte sign-extended from it (no table in memory)."""
    m = fn.m
    words = [int.from_bytes(bytes(v & 0xFF for v in values[4 * w : 4 * w + 4]), "little") for w in range(4)]
    quarter = fn.shr(nibble, m.u(2))
    word = m.u(words[3])
    for w in (2, 1, 0):
        word = fn.select(fn.icmp(Op.IEqual, quarter, m.u(w)), m.u(words[w]), word)
    offset = fn.imul(fn.band(nibble, m.u(3)), m.u(8))
    return fn.bits_s(fn.bitcast(word, m.i32), None, 8, offset_id=offset)


def render_matvec(t: Target, wtype: Q, n_out: int, k: int, use_subgroups: bool = True, experts: bool = False) -> Kernel:
    """Bindings: weights u32 [n_out*row_bytes/4], q_x u32 [rows*K/4], d_x f32 [rows*K/32],
    (s_x f32 [rows*K/32] for Q4_1 and Q5_1), y f32 [rows*n_out]; with `experts`, then expert_ids u32
    [rows] and weights a stack of [E, n_out] rows (expert_row). Workgroups: (ceil(n_out/8), rows)."""
    if wtype not in QS_OFFSET:
        raise Unsupported(f"{wtype.name} is not a block-32 type with a Vulkan kernel (ops.check_weight_type)")
    if k % 32:
        raise Unsupported(f"matvec: K = {k} is not a multiple of 32")
    block_bytes, fmt = QUANT_TYPES[wtype].block_bytes, QUANT_TYPES[wtype].activation
    nb = k // 32
    width = ROWS_PER_GROUP * LANES
    butterfly = uses_butterfly(t, use_subgroups)
    m = Module()
    words = m.storage_buffer(0, m.u32, readonly=True, name="weights")
    qx = m.storage_buffer(1, m.u32, readonly=True, name="q_x")
    dx = m.storage_buffer(2, m.f32, readonly=True, name="d_x")
    sx = m.storage_buffer(3, m.f32, readonly=True, name="s_x") if fmt == "q8_1" else None
    y = m.storage_buffer(4 if sx else 3, m.f32, name="y")
    ids = m.storage_buffer(5 if sx else 4, m.u32, readonly=True, name="expert_ids") if experts else None
    scratch = None if butterfly or dot_order(wtype) == "scalar" else m.shared_array(m.f32, width, "lanes")
    fn = m.compute_entry((width, 1, 1))
    lane, row_x, n, n_read = row_roles(fn, t, butterfly, n_out, ids)
    order = dot_order(wtype)
    acc = fn.local(m.f32, m.f(0.0))
    summs = fn.local(m.f32, m.f(0.0))
    int_scratch = None if butterfly or order == "lanes" else m.shared_array(m.i32, width, "block_sums")
    with fn.loop(m.u(0), m.u(nb)) as b:
        block_base = fn.imul(fn.iadd(fn.imul(n_read, m.u(nb)), b), m.u(block_bytes))
        d_w = builders.f16_bits_to_f32(fn, builders.load_u16_at(fn, words, block_base))
        xblock = fn.iadd(fn.imul(row_x, m.u(nb)), b)
        xword = fn.bitcast(fn.buf_load(qx, fn.iadd(fn.imul(xblock, m.u(8)), lane)), m.i32)
        isum = m.i(0)
        for i, w in enumerate(_weight_quads(fn, wtype, words, block_base, lane)):
            isum = fn.iadd(isum, fn.imul(w, fn.bits_s(xword, 8 * i, 8)))
        scale = fn.fmul(d_w, fn.buf_load(dx, xblock))
        if order == "scalar":
            isum = sum8_int(fn, isum, int_scratch, butterfly)
        fn.store(acc, builders.fma(fn, t, scale, fn.convert(isum, m.f32), fn.load(acc)))
        if sx is not None:
            m_w = builders.f16_bits_to_f32(fn, builders.load_u16_at(fn, words, fn.iadd(block_base, m.u(2))))
            fn.store(summs, builders.add(fn, fn.fmul(m_w, fn.buf_load(sx, xblock)), fn.load(summs)))
    total = fn.load(acc) if order == "scalar" else hsum8(fn, fn.load(acc), scratch, butterfly)
    if sx is not None:
        total = fn.fadd(total, fn.load(summs))
    store_row(fn, y, lane, row_x, n, n_out, total)
    fn.end()
    readonly = (True, True, True) + ((True,) if sx else ()) + (False,) + ((True,) if experts else ())
    name = f"matvec_{wtype.name.lower()}_{order}_{n_out}x{k}_{'subgroup' if butterfly else 'shared'}"
    name += "_experts" if experts else ""
    return Kernel(name, m.to_bytes(), readonly, (width, 1, 1), full_subgroups=butterfly)


def uses_butterfly(t: Target, use_subgroups: bool) -> bool:
    """Whether a row's 8 lanes can meet by subgroup shuffles: subgroups of at least 8 that tile the
    workgroup."""
    width = ROWS_PER_GROUP * LANES
    return use_subgroups and t.shuffle and t.subgroup_size >= LANES and width % t.subgroup_size == 0


def row_roles(fn: Function, t: Target, butterfly: bool, n_out: int, experts=None) -> tuple[int, int, int, int]:
    """(lane, activation row, weight row n, the row actually read) of this invocation: 8 lanes per
    weight row, 8 weight rows per workgroup, workgroup (x, y) = (rows n / 8, activation row). With
    the butterfly the roles follow the subgroup layout, so a row's lanes are lanes of one subgroup;
    rows past n_out read row n_out-1 and store nothing (control flow stays uniform). With `experts`
    the row read is in the expert the activation row chose (expert_row)."""
    m = fn.m
    if butterfly:
        sub_lane = fn.builtin(BuiltIn.SubgroupLocalInvocationId)
        lane = fn.band(sub_lane, m.u(LANES - 1))
        local_row = fn.iadd(fn.imul(fn.builtin(BuiltIn.SubgroupId), m.u(t.subgroup_size // LANES)),
                            fn.shr(sub_lane, m.u(3)))
    else:
        index = fn.builtin(BuiltIn.LocalInvocationIndex)
        lane, local_row = fn.band(index, m.u(LANES - 1)), fn.shr(index, m.u(3))
    wg = fn.builtin(BuiltIn.WorkgroupId)
    row_x = fn.emit(Op.CompositeExtract, m.u32, wg, 1)
    n = fn.iadd(fn.imul(fn.emit(Op.CompositeExtract, m.u32, wg, 0), m.u(ROWS_PER_GROUP)), local_row)
    return lane, row_x, n, expert_row(fn, fn.glsl2(GLSL.UMin, n, m.u(n_out - 1)), row_x, n_out, experts)


def expert_row(fn: Function, n_read: int, row_x: int, n_out: int, experts) -> int:
    """The weight row an invocation reads: n_read, or with `experts` (u32 [rows], the expert each
    activation row chose: moe_matmul's slot rows, vulkan/moe.py) row n_read of that expert in a stack
    of [E, n_out] rows, so the product is the plain matvec's with that expert's matrix alone."""
    if experts is None:
        return n_read
    return fn.iadd(fn.imul(fn.buf_load(experts, row_x), fn.m.u(n_out)), n_read)


def store_row(fn: Function, y, lane: int, row_x: int, n: int, n_out: int, total: int) -> None:
    """Lane 0 of a row stores y[row_x, n] when n is a real row."""
    m = fn.m
    store = fn.logical_and(fn.icmp(Op.IEqual, lane, m.u(0)), fn.icmp(Op.ULessThan, n, m.u(n_out)))
    with fn.if_(store):
        fn.buf_store(y, fn.iadd(fn.imul(row_x, m.u(n_out)), n), total)


def hsum8(fn: Function, value: int, scratch, butterfly: bool) -> int:
    """ggml's hsum_float_8 over the 8 lanes of a row: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))."""
    if butterfly:
        return _butterfly(fn, value, fn.fadd)
    lanes = _row_lanes(fn, value, scratch)
    half = [fn.fadd(lanes[i], lanes[i + 4]) for i in range(4)]
    return fn.fadd(fn.fadd(half[0], half[2]), fn.fadd(half[1], half[3]))


def sum8_int(fn: Function, value: int, scratch, butterfly: bool) -> int:
    """The exact sum of an i32 over the 8 lanes of a row, in every lane of it."""
    if butterfly:
        return _butterfly(fn, value, fn.iadd)
    lanes = _row_lanes(fn, value, scratch)
    total = lanes[0]
    for lane in lanes[1:]:
        total = fn.iadd(total, lane)
    fn.workgroup_barrier()  # everyone has read before the next block writes
    return total


def _butterfly(fn: Function, value: int, add) -> int:
    """`add` of a value over the 8 lanes of a row, by subgroup shuffles (masks 4, 2, 1), in every lane."""
    for mask in (4, 2, 1):
        value = add(value, fn.shuffle_xor(value, mask))
    return value


def _row_lanes(fn: Function, value: int, scratch) -> list[int]:
    """Each of the LANES lanes' `value` of this invocation's row, through workgroup memory `scratch`."""
    m = fn.m
    index = fn.builtin(BuiltIn.LocalInvocationIndex)
    fn.store(fn.shared_ptr(scratch, index), value)
    fn.workgroup_barrier()
    first = fn.band(index, m.u(~(LANES - 1) & 0xFFFFFFFF))
    return [fn.load(fn.shared_ptr(scratch, fn.iadd(first, m.u(i)))) for i in range(LANES)]
