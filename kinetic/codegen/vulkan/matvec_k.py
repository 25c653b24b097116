"""Quantized matrix-vector products for Q4_K and Q6_K weights (super-blocks of 256), in the order of
`numerics/dots.py`'s `_superblock_dot`, with activations quantized to Q8_K on the device.

1. `render_quantize_q8_k`: one invocation per 256 activations, `numerics.quantize_q8_k`: max = the
   first value of largest magnitude with its sign, iscale = -127 / max, q = min(127,
   RoundEven(iscale * x)), d = 1 / iscale; plus the exact sums of q per 16 values (ggml's bsums).
2. `render_matvec_k`: the block-32 kernel's shape (matvec.py: 8 weight rows per workgroup, 8 lanes
   per row, the same roles, horizontal sums and stores); per super-block of its row, in order:

   Q4_K (ggml_gemv_q4_K_8x8_q8_K, one float accumulator pair): lane l takes sub-block l,
       iacc_l = sc_l * sum_i q_i * qx_i,  imin_l = m_l * (sum of qx over the sub-block)   (exact)
       iacc, imin = sums over the 8 lanes (integer butterfly), then in every lane
       acc = fma(f32(iacc), d_w * d_x, acc);  accmin = fma(f32(imin), dmin_w * d_x, accmin)
       y = acc - accmin
   Q6_K (ggml_vec_dot_q6_K_q8_K, 8 float lanes): lane l sums sc * q6 * qx over values
       32c + 4l .. 32c + 4l + 3 of the 8 chunks c, minus 32 * sum of sc * qx over values
       32l .. 32l + 31 (exact), acc_l = fma(d_x * d_w, f32(lane_l), acc_l); y = hsum_float_8(acc).

Integer parts are exact; their conversions to f32 round to nearest (Vulkan's int-to-float
conversion is correctly rounded); the fmas round once (builders.fma). Rows never mix.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.vulkan import builders
from kinetic.codegen.vulkan.builders import Target
from kinetic.codegen.vulkan.device import Kernel, Unsupported
from kinetic.codegen.vulkan.elementwise import flat_index
from kinetic.codegen.vulkan.matvec import LANES, ROWS_PER_GROUP, hsum8, row_roles, store_row, sum8_int, uses_butterfly
from kinetic.codegen.vulkan.spirv import GLSL, Function, Module, Op
from kinetic.ir.quants import QUANT_TYPES

SUPPORTED = (Q.Q4_K, Q.Q6_K)  # their block bytes are QUANT_TYPES
QUANT_WORKGROUP = 32


def render_quantize_q8_k() -> Kernel:
    """Bindings: x f32 [rows*K], q u32 [rows*K/4], d f32 [rows*K/256], bsums i32 [rows*K/16].
    Push constant: the number of super-blocks (rows*K/256)."""
    m = Module()
    x = m.storage_buffer(0, m.f32, readonly=True, name="x")
    q_out = m.storage_buffer(1, m.u32, name="q")
    d_out = m.storage_buffer(2, m.f32, name="d")
    sums = m.storage_buffer(3, m.i32, name="bsums")
    params, _ = m.push_constants([m.u32])
    fn = m.compute_entry((QUANT_WORKGROUP, 1, 1))
    block = flat_index(fn, QUANT_WORKGROUP)
    with fn.if_(fn.icmp(Op.ULessThan, block, fn.push(params, 0, m.u32))):
        base = fn.imul(block, m.u(256))
        amax, signed_max = fn.local(m.f32, m.f(0.0)), fn.local(m.f32, m.f(0.0))
        with fn.loop(m.u(0), m.u(256)) as i:  # the first value of largest magnitude, with its sign
            v = fn.buf_load(x, fn.iadd(base, i))
            bigger = fn.fcmp(Op.FOrdGreaterThan, fn.glsl1(GLSL.FAbs, v), fn.load(amax))
            fn.store(amax, fn.select(bigger, fn.glsl1(GLSL.FAbs, v), fn.load(amax)))
            fn.store(signed_max, fn.select(bigger, v, fn.load(signed_max)))
        top = fn.load(signed_max)
        nonzero = fn.fcmp(Op.FUnordNotEqual, top, m.f(0.0))
        iscale = fn.select(nonzero, fn.fdiv(m.f(-127.0), top), m.f(0.0))
        fn.buf_store(d_out, block, fn.select(nonzero, fn.fdiv(m.f(1.0), iscale), m.f(0.0)))
        with fn.loop(m.u(0), m.u(16)) as j:  # 16 values: 4 words of quants and one bsum
            total = m.i(0)
            for w in range(4):
                word = m.u(0)
                for b in range(4):
                    v = fn.buf_load(x, fn.iadd(base, fn.iadd(fn.imul(j, m.u(16)), m.u(4 * w + b))))
                    q = fn.convert(fn.glsl2(GLSL.FMin, fn.glsl1(GLSL.RoundEven, fn.fmul(iscale, v)), m.f(127.0)), m.i32)
                    total = fn.iadd(total, q)
                    word = fn.bor(word, fn.shl(fn.band(fn.bitcast(q, m.u32), m.u(0xFF)), m.u(8 * b)))
                fn.buf_store(q_out, fn.iadd(fn.imul(block, m.u(64)), fn.iadd(fn.imul(j, m.u(4)), m.u(w))), word)
            fn.buf_store(sums, fn.iadd(fn.imul(block, m.u(16)), j), total)
    fn.end()
    return Kernel("quantize_q8_k", m.to_bytes(), (True, False, False, False), (QUANT_WORKGROUP, 1, 1), push_size=4)


def _byte_of(fn: Function, words: list[int], index: int) -> int:
    """Byte `index` (a u32 id, below 4*len(words)) of a few consecutive words, as u32."""
    m = fn.m
    word = words[-1]
    for w in range(len(words) - 2, -1, -1):
        word = fn.select(fn.icmp(Op.ULessThan, index, m.u(4 * (w + 1))), words[w], word)
    return fn.bits_u(word, None, 8, offset_id=fn.shl(fn.band(index, m.u(3)), m.u(3)))


def _dot4(fn: Function, weights: list[int], xword: int) -> int:
    """sum of 4 integer weights times the 4 int8 quants of an activation word (i32)."""
    x = fn.bitcast(xword, fn.m.i32)
    total = fn.m.i(0)
    for i, w in enumerate(weights):
        total = fn.iadd(total, fn.imul(w, fn.bits_s(x, 8 * i, 8)))
    return total


def _q4_k_parts(fn: Function, words, qx, sums, base: int, xblock: int, lane: int) -> tuple[int, int]:
    """This lane's sub-block: (sc * sum q*qx, m * sum qx), exact."""
    m = fn.m
    scales = [fn.buf_load(words, fn.iadd(fn.shr(base, m.u(2)), m.u(1 + w))) for w in range(3)]
    low = fn.band(lane, m.u(3))  # j-4 for j >= 4
    b_j, b_j4, b_low = (_byte_of(fn, scales, i) for i in (lane, fn.iadd(lane, m.u(4)), low))
    first = fn.icmp(Op.ULessThan, lane, m.u(4))  # ggml's get_scale_min_k4
    sc = fn.select(first, fn.band(b_j, m.u(63)),
                   fn.bor(fn.band(b_j4, m.u(15)), fn.shl(fn.shr(b_low, m.u(6)), m.u(4))))
    mn = fn.select(first, fn.band(b_j4, m.u(63)), fn.bor(fn.shr(b_j4, m.u(4)), fn.shl(fn.shr(b_j, m.u(6)), m.u(4))))
    # sub-block l: the low (l even) or high nibbles of qs bytes 32*(l/2) .. +31
    qs_byte = fn.iadd(base, fn.iadd(m.u(16), fn.imul(fn.shr(lane, m.u(1)), m.u(32))))
    shift = fn.imul(fn.band(lane, m.u(1)), m.u(4))
    isum = m.i(0)
    for w in range(8):
        word = fn.buf_load(words, fn.iadd(fn.shr(qs_byte, m.u(2)), m.u(w)))
        nib = [fn.bitcast(fn.bits_u(word, None, 4, offset_id=fn.iadd(m.u(8 * i), shift)), m.i32) for i in range(4)]
        xw = fn.buf_load(qx, fn.iadd(fn.imul(xblock, m.u(64)), fn.iadd(fn.imul(lane, m.u(8)), m.u(w))))
        isum = fn.iadd(isum, _dot4(fn, nib, xw))
    bsum = fn.iadd(*(fn.buf_load(sums, fn.iadd(fn.imul(xblock, m.u(16)), fn.iadd(fn.imul(lane, m.u(2)), m.u(h))))
                     for h in range(2)))
    return fn.imul(isum, fn.bitcast(sc, m.i32)), fn.imul(bsum, fn.bitcast(mn, m.i32))


def _q6_k_lane(fn: Function, words, qx, sums, base: int, xblock: int, lane: int) -> int:
    """Lane l of ggml's Q6_K dot for this super-block, exact."""
    m = fn.m
    total = m.i(0)
    four_l = fn.imul(lane, m.u(4))
    for c in range(8):
        h, part = divmod(c, 4)  # 128-value half, 32-value part within it
        ql_byte = fn.iadd(base, fn.iadd(m.u(64 * h + 32 * (part % 2)), four_l))
        ql = builders.load_u32_at(fn, words, ql_byte)
        qh = builders.load_u32_at(fn, words, fn.iadd(base, fn.iadd(m.u(128 + 32 * h), four_l)))
        sc_pair = fn.bitcast(builders.load_u16_at(fn, words, fn.iadd(base, m.u(192 + 2 * c))), m.i32)
        sc = fn.bits_s(sc_pair, None, 8, offset_id=fn.imul(fn.shr(lane, m.u(2)), m.u(8)))
        q6 = [fn.bitcast(fn.bor(fn.bits_u(ql, 8 * i + 4 * (part // 2), 4),
                                fn.shl(fn.bits_u(qh, 8 * i + 2 * part, 2), m.u(4))), m.i32) for i in range(4)]
        xw = fn.buf_load(qx, fn.iadd(fn.imul(xblock, m.u(64)), fn.iadd(m.u(8 * c), lane)))
        total = fn.iadd(total, fn.imul(sc, _dot4(fn, q6, xw)))
    # minus 32 * sum of sc * qx over values 32l .. 32l+31 (two scales of 16)
    sc_pair = fn.bitcast(builders.load_u16_at(fn, words, fn.iadd(base, fn.iadd(m.u(192), fn.imul(lane, m.u(2))))),
                         m.i32)
    offset = m.i(0)
    for h in range(2):
        bsum = fn.buf_load(sums, fn.iadd(fn.imul(xblock, m.u(16)), fn.iadd(fn.imul(lane, m.u(2)), m.u(h))))
        offset = fn.iadd(offset, fn.imul(fn.bits_s(sc_pair, 8 * h, 8), bsum))
    return fn.isub(total, fn.imul(offset, m.i(32)))


def render_matvec_k(t: Target, wtype: Q, n_out: int, k: int, use_subgroups: bool = True) -> Kernel:
    """Bindings: weights u32, q_x u32 [rows*K/4], d_x f32 [rows*K/256], bsums i32 [rows*K/16],
    y f32 [rows*n_out]. Workgroups: (ceil(n_out/8), rows)."""
    if wtype not in SUPPORTED:
        raise Unsupported(f"{wtype.name} is not a super-block type with a Vulkan kernel")
    if k % 256:
        raise Unsupported(f"matvec: K = {k} is not a multiple of 256 for {wtype.name}")
    nsb, block_bytes = k // 256, QUANT_TYPES[wtype].block_bytes
    width = ROWS_PER_GROUP * LANES
    butterfly = uses_butterfly(t, use_subgroups)
    m = Module()
    words = m.storage_buffer(0, m.u32, readonly=True, name="weights")
    qx = m.storage_buffer(1, m.u32, readonly=True, name="q_x")
    dx = m.storage_buffer(2, m.f32, readonly=True, name="d_x")
    sums = m.storage_buffer(3, m.i32, readonly=True, name="bsums")
    y = m.storage_buffer(4, m.f32, name="y")
    f_scratch = None if butterfly else m.shared_array(m.f32, width, "lanes")
    i_scratch = None if butterfly else m.shared_array(m.i32, width, "block_sums")
    fn = m.compute_entry((width, 1, 1))
    lane, row_x, n, n_read = row_roles(fn, t, butterfly, n_out)
    acc, accmin = fn.local(m.f32, m.f(0.0)), fn.local(m.f32, m.f(0.0))
    with fn.loop(m.u(0), m.u(nsb)) as b:
        base = fn.imul(fn.iadd(fn.imul(n_read, m.u(nsb)), b), m.u(block_bytes))
        xblock = fn.iadd(fn.imul(row_x, m.u(nsb)), b)
        d_x = fn.buf_load(dx, xblock)
        if wtype is Q.Q4_K:
            iacc, imin = _q4_k_parts(fn, words, qx, sums, base, xblock, lane)
            iacc, imin = sum8_int(fn, iacc, i_scratch, butterfly), sum8_int(fn, imin, i_scratch, butterfly)
            d_w = builders.f16_bits_to_f32(fn, builders.load_u16_at(fn, words, base))
            dmin_w = builders.f16_bits_to_f32(fn, builders.load_u16_at(fn, words, fn.iadd(base, m.u(2))))
            fn.store(acc, builders.fma(fn, t, fn.convert(iacc, m.f32), fn.fmul(d_w, d_x), fn.load(acc)))
            fn.store(accmin, builders.fma(fn, t, fn.convert(imin, m.f32), fn.fmul(dmin_w, d_x), fn.load(accmin)))
        else:
            lane_sum = _q6_k_lane(fn, words, qx, sums, base, xblock, lane)
            d_w = builders.f16_bits_to_f32(fn, builders.load_u16_at(fn, words, fn.iadd(base, m.u(208))))
            fn.store(acc, builders.fma(fn, t, fn.fmul(d_x, d_w), fn.convert(lane_sum, m.f32), fn.load(acc)))
    if wtype is Q.Q4_K:
        total = fn.fsub(fn.load(acc), fn.load(accmin))
    else:
        total = hsum8(fn, fn.load(acc), f_scratch, butterfly)
    store_row(fn, y, lane, row_x, n, n_out, total)
    fn.end()
    name = f"matvec_{wtype.name.lower()}_{n_out}x{k}_{'subgroup' if butterfly else 'shared'}"
    return Kernel(name, m.to_bytes(), (True, True, True, True, False), (width, 1, 1), full_subgroups=butterfly)
