"""Quantized matrix-vector products for K-quant weights (Q4_K, Q6_K, Q5_K, Q3_K: super-blocks of 256),
in the order of `numerics/dots.py`'s `_superblock_dot` (Q4_K, Q6_K) and `_parts_dot` (Q5_K, Q3_K, on
kinetic/ir/quant_dots.py's integer parts), with activations quantized to Q8_K on the device.

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
   Q5_K, Q3_K (ggml_vec_dot_q5_K_q8_K / _q3_K_q8_K, 8 float lanes): lane l sums sc * q * qx over
       values 32c + 4l .. 32c + 4l + 3 of the 8 chunks c, sc the scale of the value's sub-block
       (Q3_K: of 16 values, offset 32 removed; q = low 2 bits - 4 unless the hmask bit is set; Q5_K:
       of 32, q = nibble + 16 * high bit), acc_l = fma(f32(lane_l), d_x * d_w, acc_l);
       y = hsum_float_8(acc), Q5_K plus its minimum chain: lane l takes
       m_l * (sum of qx over sub-block l), imin = the sum over the lanes (exact), in every lane
       accm = fma(-(d_x * dmin_w), f32(imin), accm); y = hsum_float_8(acc) + accm.

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

SUPPORTED = (Q.Q4_K, Q.Q6_K, Q.Q5_K, Q.Q3_K, Q.Q2_K)  # their block bytes are QUANT_TYPES
D_OFFSET = {Q.Q4_K: 0, Q.Q5_K: 0, Q.Q3_K: 108, Q.Q2_K: 80}  # the f16 d of a block (dmin follows at + 2)
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


def k4_scale_words(fn: Function, words, base: int) -> list[int]:
    """The 3 words of packed scales and minimums at base + 4 of a Q4_K / Q5_K block (whose size keeps
    base a multiple of 4)."""
    m = fn.m
    return [fn.buf_load(words, fn.iadd(fn.shr(base, m.u(2)), m.u(1 + w))) for w in range(3)]


def scale_min_k4(fn: Function, scales: list[int], j: int) -> tuple[int, int]:
    """ggml's get_scale_min_k4: the 6-bit scale and minimum j (a u32 id) of the packed words, as u32."""
    m = fn.m
    low = fn.band(j, m.u(3))  # j-4 for j >= 4
    b_j, b_j4, b_low = (_byte_of(fn, scales, i) for i in (j, fn.iadd(j, m.u(4)), low))
    first = fn.icmp(Op.ULessThan, j, m.u(4))
    sc = fn.select(first, fn.band(b_j, m.u(63)),
                   fn.bor(fn.band(b_j4, m.u(15)), fn.shl(fn.shr(b_low, m.u(6)), m.u(4))))
    mn = fn.select(first, fn.band(b_j4, m.u(63)), fn.bor(fn.shr(b_j4, m.u(4)), fn.shl(fn.shr(b_j, m.u(6)), m.u(4))))
    return sc, mn


def _sub_block_sum(fn: Function, sums, xblock: int, lane: int) -> int:
    """The sum of the Q8_K quants of sub-block `lane` (32 values: two sums of 16), exact."""
    m = fn.m
    return fn.iadd(*(fn.buf_load(sums, fn.iadd(fn.imul(xblock, m.u(16)), fn.iadd(fn.imul(lane, m.u(2)), m.u(h))))
                     for h in range(2)))


def _q4_k_parts(fn: Function, words, qx, sums, base: int, xblock: int, lane: int) -> tuple[int, int]:
    """This lane's sub-block: (sc * sum q*qx, m * sum qx), exact."""
    m = fn.m
    sc, mn = scale_min_k4(fn, k4_scale_words(fn, words, base), lane)
    # sub-block l: the low (l even) or high nibbles of qs bytes 32*(l/2) .. +31
    qs_byte = fn.iadd(base, fn.iadd(m.u(16), fn.imul(fn.shr(lane, m.u(1)), m.u(32))))
    shift = fn.imul(fn.band(lane, m.u(1)), m.u(4))
    isum = m.i(0)
    for w in range(8):
        word = fn.buf_load(words, fn.iadd(fn.shr(qs_byte, m.u(2)), m.u(w)))
        nib = [fn.bitcast(fn.bits_u(word, None, 4, offset_id=fn.iadd(m.u(8 * i), shift)), m.i32) for i in range(4)]
        xw = fn.buf_load(qx, fn.iadd(fn.imul(xblock, m.u(64)), fn.iadd(fn.imul(lane, m.u(8)), m.u(w))))
        isum = fn.iadd(isum, _dot4(fn, nib, xw))
    bsum = _sub_block_sum(fn, sums, xblock, lane)
    return fn.imul(isum, fn.bitcast(sc, m.i32)), fn.imul(bsum, fn.bitcast(mn, m.i32))


def _q2_k_parts(fn: Function, words, qx, sums, base: int, xblock: int, lane: int) -> tuple[int, int]:
    """Lane l's 32 values 128h + 32s + j (h = l >> 2, s = l & 3; 2 bits each in qs[32h + j] >> 2s),
    sub-blocks 2l and 2l + 1 of 16: (sum of sc * q * qx, sum of m * (sum of qx)), exact."""
    m = fn.m
    sub = builders.load_u16_at(fn, words, fn.iadd(base, fn.imul(lane, m.u(2))))  # the two sub-blocks' bytes
    qs_byte = fn.iadd(base, fn.iadd(m.u(16), fn.imul(fn.shr(lane, m.u(2)), m.u(32))))
    shift = fn.imul(fn.band(lane, m.u(3)), m.u(2))
    iacc, imin = m.i(0), m.i(0)
    for half in range(2):
        isum = m.i(0)
        for w in range(4 * half, 4 * half + 4):
            word = fn.buf_load(words, fn.iadd(fn.shr(qs_byte, m.u(2)), m.u(w)))
            q2 = [fn.bitcast(fn.bits_u(word, None, 2, offset_id=fn.iadd(m.u(8 * i), shift)), m.i32) for i in range(4)]
            xw = fn.buf_load(qx, fn.iadd(fn.imul(xblock, m.u(64)), fn.iadd(fn.imul(lane, m.u(8)), m.u(w))))
            isum = fn.iadd(isum, _dot4(fn, q2, xw))
        byte = fn.bitcast(fn.bits_u(sub, 8 * half, 8), m.i32)
        bsum = fn.buf_load(sums, fn.iadd(fn.imul(xblock, m.u(16)), fn.iadd(fn.imul(lane, m.u(2)), m.u(half))))
        iacc = fn.iadd(iacc, fn.imul(fn.band(byte, m.i(15)), isum))
        imin = fn.iadd(imin, fn.imul(fn.shr(byte, m.i(4)), bsum))
    return iacc, imin


def _q5_k_lane(fn: Function, words, qx, base: int, xblock: int, lane: int) -> int:
    """Lane l of ggml's Q5_K dot for this super-block (no minimum), exact: chunk c's values 32c + j
    have their low nibble in qs[32(c >> 1) + j] >> 4(c & 1) and their fifth bit in bit c of qh[j]."""
    m = fn.m
    four_l = fn.imul(lane, m.u(4))
    qh = builders.load_u32_at(fn, words, fn.iadd(base, fn.iadd(m.u(16), four_l)))
    scales = k4_scale_words(fn, words, base)
    total = m.i(0)
    for c in range(8):
        qs = builders.load_u32_at(fn, words, fn.iadd(base, fn.iadd(m.u(48 + 32 * (c >> 1)), four_l)))
        q5 = [fn.bitcast(fn.bor(fn.bits_u(qs, 8 * i + 4 * (c & 1), 4), fn.shl(fn.bits_u(qh, 8 * i + c, 1), m.u(4))),
                         m.i32) for i in range(4)]
        sc, _ = scale_min_k4(fn, scales, m.u(c))
        xw = fn.buf_load(qx, fn.iadd(fn.imul(xblock, m.u(64)), fn.iadd(m.u(8 * c), lane)))
        total = fn.iadd(total, fn.imul(fn.bitcast(sc, m.i32), _dot4(fn, q5, xw)))
    return total


def _q3_k_lane(fn: Function, words, qx, base: int, xblock: int, lane: int) -> int:
    """Lane l of ggml's Q3_K dot for this super-block, exact: chunk c = 4h + s's values 32c + j have
    their low 2 bits in qs[32h + j] >> 2s, minus 4 unless bit c of hmask[j] is set; the scale of
    values 32c + 4l.. is scale 2c + (l >> 2) of 16 (low 4 bits in nibble h of byte (2c & 7) +
    (l >> 2), high 2 in crumb c >> 1 of byte 8 + 2(c & 1) + (l >> 2); offset 32). Blocks are 110
    bytes, so every field is read at a 2-byte-aligned offset."""
    m = fn.m
    four_l, half = fn.imul(lane, m.u(4)), fn.imul(fn.shr(lane, m.u(2)), m.u(8))
    hmask = builders.load_u32_at(fn, words, fn.iadd(base, four_l))
    total = m.i(0)
    for c in range(8):
        h, s = divmod(c, 4)
        qs = builders.load_u32_at(fn, words, fn.iadd(base, fn.iadd(m.u(32 + 32 * h), four_l)))
        q3 = [fn.isub(fn.bitcast(fn.bor(fn.bits_u(qs, 8 * i + 2 * s, 2), fn.shl(fn.bits_u(hmask, 8 * i + c, 1),
                                                                               m.u(2))), m.i32), m.i(4))
              for i in range(4)]
        low = fn.bits_u(builders.load_u16_at(fn, words, fn.iadd(base, m.u(96 + (2 * c & 7)))), None, 8, offset_id=half)
        high = fn.bits_u(builders.load_u16_at(fn, words, fn.iadd(base, m.u(104 + 2 * (c & 1)))), None, 8,
                         offset_id=half)
        sc = fn.bor(fn.bits_u(low, 4 * h, 4), fn.shl(fn.bits_u(high, 2 * (c >> 1), 2), m.u(4)))
        xw = fn.buf_load(qx, fn.iadd(fn.imul(xblock, m.u(64)), fn.iadd(m.u(8 * c), lane)))
        total = fn.iadd(total, fn.imul(fn.isub(fn.bitcast(sc, m.i32), m.i(32)), _dot4(fn, q3, xw)))
    return total


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


# the "scalar" types (one float chain and its minimum twin): each lane's exact (iacc, imin) parts
SCALAR_PARTS = {Q.Q4_K: _q4_k_parts, Q.Q2_K: _q2_k_parts}


def render_matvec_k(t: Target, wtype: Q, n_out: int, k: int, use_subgroups: bool = True,
                    experts: bool = False) -> Kernel:
    """Bindings: weights u32, q_x u32 [rows*K/4], d_x f32 [rows*K/256], bsums i32 [rows*K/16],
    y f32 [rows*n_out]; with `experts`, expert_ids u32 [rows] (matvec.expert_row). Workgroups:
    (ceil(n_out/8), rows)."""
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
    ids = m.storage_buffer(5, m.u32, readonly=True, name="expert_ids") if experts else None
    f_scratch = None if butterfly else m.shared_array(m.f32, width, "lanes")
    i_scratch = None if butterfly else m.shared_array(m.i32, width, "block_sums")
    fn = m.compute_entry((width, 1, 1))
    lane, row_x, n, n_read = row_roles(fn, t, butterfly, n_out, ids)
    acc, accmin = fn.local(m.f32, m.f(0.0)), fn.local(m.f32, m.f(0.0))
    with fn.loop(m.u(0), m.u(nsb)) as b:
        base = fn.imul(fn.iadd(fn.imul(n_read, m.u(nsb)), b), m.u(block_bytes))
        xblock = fn.iadd(fn.imul(row_x, m.u(nsb)), b)
        d_x = fn.buf_load(dx, xblock)
        if wtype in SCALAR_PARTS:
            iacc, imin = SCALAR_PARTS[wtype](fn, words, qx, sums, base, xblock, lane)
            iacc, imin = sum8_int(fn, iacc, i_scratch, butterfly), sum8_int(fn, imin, i_scratch, butterfly)
            d_at = D_OFFSET[wtype]
            d_w = builders.f16_bits_to_f32(fn, builders.load_u16_at(fn, words, fn.iadd(base, m.u(d_at))))
            dmin_w = builders.f16_bits_to_f32(fn, builders.load_u16_at(fn, words, fn.iadd(base, m.u(d_at + 2))))
            fn.store(acc, builders.fma(fn, t, fn.convert(iacc, m.f32), fn.fmul(d_w, d_x), fn.load(acc)))
            fn.store(accmin, builders.fma(fn, t, fn.convert(imin, m.f32), fn.fmul(dmin_w, d_x), fn.load(accmin)))
        elif wtype is Q.Q6_K:
            lane_sum = _q6_k_lane(fn, words, qx, sums, base, xblock, lane)
            d_w = builders.f16_bits_to_f32(fn, builders.load_u16_at(fn, words, fn.iadd(base, m.u(208))))
            fn.store(acc, builders.fma(fn, t, fn.fmul(d_x, d_w), fn.convert(lane_sum, m.f32), fn.load(acc)))
        else:
            lanes_k(fn, t, wtype, words, qx, sums, base, xblock, lane, d_x, acc, accmin, i_scratch, butterfly)
    if wtype in SCALAR_PARTS:
        total = fn.fsub(fn.load(acc), fn.load(accmin))
    else:
        total = hsum8(fn, fn.load(acc), f_scratch, butterfly)
        if wtype is Q.Q5_K:  # accmin holds the minimum chain, -(d_x * dmin_w) * imin added in
            total = fn.fadd(total, fn.load(accmin))
    store_row(fn, y, lane, row_x, n, n_out, total)
    fn.end()
    name = f"matvec_{wtype.name.lower()}_{n_out}x{k}_{'subgroup' if butterfly else 'shared'}"
    name += "_experts" if experts else ""
    readonly = (True, True, True, True, False) + ((True,) if experts else ())
    return Kernel(name, m.to_bytes(), readonly, (width, 1, 1), full_subgroups=butterfly)


def lanes_k(fn: Function, t: Target, wtype: Q, words, qx, sums, base: int, xblock: int, lane: int, d_x: int,
            acc: int, accmin: int, i_scratch, butterfly: bool) -> None:
    """One super-block of Q5_K / Q3_K (the "lanes" order of _parts_dot): this lane's chain
    acc = fma(f32(lane_l), d_x * d_w, acc); Q5_K's minimum chain accmin = fma(-(d_x * dmin_w),
    f32(imin), accmin), imin summed over the 8 lanes (exact)."""
    m = fn.m
    lane_sum = (_q5_k_lane if wtype is Q.Q5_K else _q3_k_lane)(fn, words, qx, base, xblock, lane)
    d_w = builders.f16_bits_to_f32(fn, builders.load_u16_at(fn, words, fn.iadd(base, m.u(D_OFFSET[wtype]))))
    fn.store(acc, builders.fma(fn, t, fn.convert(lane_sum, m.f32), fn.fmul(d_x, d_w), fn.load(acc)))
    if wtype is Q.Q5_K:
        _, mn = scale_min_k4(fn, k4_scale_words(fn, words, base), lane)
        imin = sum8_int(fn, fn.imul(_sub_block_sum(fn, sums, xblock, lane), fn.bitcast(mn, m.i32)), i_scratch,
                        butterfly)
        dmin_w = builders.f16_bits_to_f32(fn, builders.load_u16_at(fn, words, fn.iadd(base, m.u(2))))
        fn.store(accmin, builders.fma(fn, t, fn.fneg(fn.fmul(d_x, dmin_w)), fn.convert(imin, m.f32),
                                      fn.load(accmin)))
