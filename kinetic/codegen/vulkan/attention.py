"""Attention over an f16 KV cache and the C library's expf, as SPIR-V.

Owns: the attention kernel for one pass's query rows over an f16 cache (keys and values as f16 bits
packed two to a word, a visibility word per (row, key) that the runtime derives from the pass's row
table: committed cache, earlier rows of the pass, a sliding window; each row's cache given by its
first row in the device's pool of caches, common/kv_mirror.py, so the rows of several sequences share
one dispatch, each over its own cache) and `expf_libc`, glibc's expf in double precision. The cache
store is gather.py's. Does not own the cache's layout, which keys a row sees (the runtime:
common/pass_caches.py), or the meaning (numerics.attention_online).

The kernel follows the reference (ggml's CPU flash attention for one query row) exactly, one
workgroup of 64 per (row, head); invocation t holds head values 64c + t (c < head_dim/64):

* q is rounded to f16; the score is ggml_vec_dot_f16's order: its 64 float lanes are chains over
  the chunks of 64 (each product of two f16 values is exact in f32, so a multiply and an add are
  the fma), then (acc0+acc2)+(acc1+acc3), the halves 16 -> 8 -> 4 and (l0+l2)+(l1+l3): the lanes go
  through shared memory and every invocation sums them in that tree;
* the online softmax in key order: on a new maximum ms = expf(M_old - s), else vs = expf(s - M);
  the f16 accumulator is scaled (an f32 product rounded to f16) and then acc = f16(fma(v, vs, acc)),
  S = fma(S, ms, vs) (builders.fma: rounding once), and out = acc * (1/S) (0 where S is 0).

Because the reference's softmax is one chain over the keys, the keys are not split. Soft-capping
needs the C library's tanhf and is refused. Heads of 64k values only (ggml's whole chunks; the
reference adds a tail in float64).

expf: glibc's __expf (kinetic/codegen/common/expf.py has its constants, codegen/cpu/expf_ir.py the
proof). Its first two operations are fmas of a double constant and x; Vulkan may split a double Fma (lavapipe does), so
they are formed exactly here: InvLn2N = HI + LO with HI of 29 bits, so HI*x and LO*x are exact
doubles; their sum p plus its TwoSum error e is x*InvLn2N exactly. k = round-half-even(p + e) is
rint(p) except where p lies exactly halfway and e breaks the tie; r = (p - k) + e (p - k exact) is
the fma rounded once. The polynomial's fmas are a multiply and an add, which is glibc's SSE2 build:
that build differs from the FMA one only through z's rounding (benchmarks/expf_exhaustive.py), and
z is exact here. The 32-entry table comes in as a buffer (`expf_table_words`).
"""

from __future__ import annotations

import numpy as np

from kinetic.codegen.common import expf
from kinetic.codegen.vulkan import builders
from kinetic.codegen.vulkan.builders import Target
from kinetic.codegen.vulkan.device import Kernel, Unsupported
from kinetic.codegen.vulkan.elementwise import flat_group, flat_index
from kinetic.codegen.vulkan.frame import frame
from kinetic.codegen.vulkan.spirv import BuiltIn, Function, Module, Op

WORKGROUP = 64
_INV_LN2_N = float(np.uint64(int(expf.INV_LN2_N, 16)).view(np.float64))
_HI = float(np.uint64(int(expf.INV_LN2_N, 16) & ~((1 << 24) - 1)).view(np.float64))  # 29 bits
_LO = _INV_LN2_N - _HI  # exact: the low 24 bits
_SHIFT = float(np.uint64(int(expf.SHIFT, 16)).view(np.float64))
_POLY = [float(np.uint64(int(c, 16)).view(np.float64)) for c in expf.POLY]


def expf_table_words() -> np.ndarray:
    """u32 [64]: glibc's 32-entry table as (low, high) words, the buffer expf_libc reads."""
    return np.array(expf.TABLE, np.uint64).view(np.uint32)


def expf_libc(fn: Function, table, x: int) -> int:
    """glibc's expf of an f32 id, in double precision (see the module docstring); `table` is the
    u32 buffer of expf_table_words()."""
    m = fn.m
    f64 = m.float_(64)

    def d(value: float) -> int:
        return m.const(f64, value)

    xd = fn.convert(x, f64)
    p1, p2 = fn.fmul(d(_HI), xd), fn.fmul(d(_LO), xd)  # both exact
    p = fn.fadd(p1, p2)
    bb = fn.fsub(p, p1)
    e = fn.fadd(fn.fsub(p1, fn.fsub(p, bb)), fn.fsub(p2, bb))  # p + e == x * InvLn2N exactly
    n = fn.fsub(fn.fadd(p, d(_SHIFT)), d(_SHIFT))  # rint(p), ties to even
    frac = fn.fsub(p, n)  # exact
    up = fn.logical_and(fn.fcmp(Op.FOrdEqual, frac, d(0.5)), fn.fcmp(Op.FOrdGreaterThan, e, d(0.0)))
    down = fn.logical_and(fn.fcmp(Op.FOrdEqual, frac, d(-0.5)), fn.fcmp(Op.FOrdLessThan, e, d(0.0)))
    kd = fn.fadd(n, fn.select(up, d(1.0), fn.select(down, d(-1.0), d(0.0))))
    r = fn.fadd(fn.fsub(p, kd), e)  # fma(InvLn2N, x, -kd), rounded once
    ki = fn.bitcast(fn.convert(kd, m.i32), m.u32)
    slot = fn.band(ki, m.u(31))
    lo = fn.buf_load(table, fn.imul(slot, m.u(2)))
    hi = fn.buf_load(table, fn.iadd(fn.imul(slot, m.u(2)), m.u(1)))
    hi = fn.iadd(hi, fn.shl(ki, m.u(15)))  # + (ki << 47) in the high word; the low word gets no carry
    s = fn.bitcast(fn.emit(Op.CompositeConstruct, m.vector(m.u32, 2), lo, hi), f64)
    c0, c1, c2 = (d(c) for c in _POLY)
    cubic = fn.fadd(fn.fmul(r, c0), c1)
    r2 = fn.fmul(r, r)
    linear = fn.fadd(fn.fmul(r, c2), d(1.0))
    poly = fn.fadd(fn.fmul(cubic, r2), linear)
    y = fn.convert(fn.fmul(poly, s), m.f32)
    for cmp, bound, value in ((Op.FOrdLessThan, "-0x1.9d1d9ep6", 2.0**-149), (Op.FOrdLessThan, "-0x1.9fe368p6", 0.0),
                              (Op.FOrdGreaterThan, "0x1.62e42ep6", float("inf"))):
        y = fn.select(fn.fcmp(cmp, x, m.f(float.fromhex(bound))), m.f(value), y)
    nan = fn.fcmp(Op.FUnordNotEqual, x, x)
    return fn.select(nan, fn.fadd(x, x), y)


def _round_f16(fn: Function, x: int) -> int:
    return builders.f16_bits_to_f32(fn, builders.f32_to_f16_bits(fn, x))


def _load_f16(fn: Function, words, index: int) -> int:
    """The f16 at element `index` of a buffer of packed pairs, as f32."""
    m = fn.m
    word = fn.buf_load(words, fn.shr(index, m.u(1)))
    h = fn.bits_u(word, None, 16, offset_id=fn.shl(fn.band(index, m.u(1)), m.u(4)))
    return builders.f16_bits_to_f32(fn, h)


def render_float_map(name: str, apply) -> Kernel:
    """y[i] = apply(fn, table, x[i]) for i < n (push constant): the tests' window on one float
    function of the shaders (expf_libc here, logf.py's logf and softplus). Bindings: x f32, the expf
    table u32 [64], y f32."""
    f = frame(("x", "f32"), ("expf_table", "u32"), ("y", "f32"), workgroup=WORKGROUP)
    fn, (x, table, y) = f.fn, f.buffers
    index = flat_index(fn, WORKGROUP)
    with fn.if_(fn.icmp(Op.ULessThan, index, f.push())):
        fn.buf_store(y, index, apply(fn, table, fn.buf_load(x, index)))
    return f.kernel(name)


def render_expf_map() -> Kernel:
    """y[i] = expf_libc(x[i]): render_float_map over expf_libc."""
    return render_float_map("expf_libc_map", expf_libc)


def render_attention(t: Target, n_head: int, n_kv_head: int, head_dim: int, scale: float,
                     softcap: float = 0.0) -> Kernel:
    """Bindings: q f32 [rows, n_head*head_dim]; keys, values: f16 pairs u32 [pool rows *
    n_kv_head*head_dim/2] (the pool of caches); visible u32 [rows, n_keys] (nonzero: the row sees its
    cache's key j); cache_rows u32 [rows] (the pool row of each row's cache's key 0: key j is pool
    row cache_rows[row] + j); the expf table u32 [64]; out f32 [rows, n_head*head_dim]. Push
    constant: n_keys. One workgroup per (row, head), flattened over a 2-D grid (rows * n_head
    workgroups)."""
    if softcap:
        raise Unsupported("attention soft-capping (the reference calls the C library's tanhf) has no Vulkan kernel")
    if head_dim % 64:
        raise Unsupported(f"attention head size {head_dim}: only multiples of 64 (ggml's whole chunks)")
    if n_head % n_kv_head:
        raise Unsupported(f"{n_head} heads do not share {n_kv_head} kv heads evenly")
    chunks, group, kv_width = head_dim // 64, n_head // n_kv_head, n_kv_head * head_dim
    m = Module()
    q = m.storage_buffer(0, m.f32, readonly=True, name="q")
    keys = m.storage_buffer(1, m.u32, readonly=True, name="keys")
    values = m.storage_buffer(2, m.u32, readonly=True, name="values")
    visible = m.storage_buffer(3, m.u32, readonly=True, name="visible")
    cache_rows = m.storage_buffer(4, m.u32, readonly=True, name="cache_rows")
    table = m.storage_buffer(5, m.u32, readonly=True, name="expf_table")
    out = m.storage_buffer(6, m.f32, name="out")
    params, _ = m.push_constants([m.u32])
    lanes = m.shared_array(m.f32, WORKGROUP, "dot_lanes")
    fn = m.compute_entry((WORKGROUP, 1, 1))
    unit = flat_group(fn)  # row * n_head + head
    row, head = fn.udiv(unit, m.u(n_head)), fn.umod(unit, m.u(n_head))
    t_id = fn.builtin(BuiltIn.LocalInvocationIndex)
    n_keys = fn.push(params, 0, m.u32)
    qbase = fn.imul(unit, m.u(head_dim))
    kv_head_base = fn.imul(fn.udiv(head, m.u(group)), m.u(head_dim))
    first_key = fn.buf_load(cache_rows, row)  # the row's cache in the pool
    qv = [_round_f16(fn, fn.buf_load(q, fn.iadd(qbase, fn.iadd(t_id, m.u(64 * c))))) for c in range(chunks)]
    acc = [fn.local(m.f32, m.f(0.0)) for _ in range(chunks)]
    m_run = fn.local(m.f32, m.f(float("-inf")))
    s_sum = fn.local(m.f32, m.f(0.0))
    with fn.loop(m.u(0), n_keys) as j:
        seen = fn.buf_load(visible, fn.iadd(fn.imul(row, n_keys), j))
        with fn.if_(fn.icmp(Op.INotEqual, seen, m.u(0))):  # uniform over the workgroup
            krow = fn.iadd(fn.imul(fn.iadd(first_key, j), m.u(kv_width)), kv_head_base)
            lane = m.f(0.0)
            for c in range(chunks):
                k = _load_f16(fn, keys, fn.iadd(krow, fn.iadd(t_id, m.u(64 * c))))
                lane = fn.fadd(fn.fmul(qv[c], k), lane)  # the product is exact: this is the fma
            fn.store(fn.shared_ptr(lanes, t_id), lane)
            fn.workgroup_barrier()
            score = _dot_tree(fn, lanes)
            fn.workgroup_barrier()  # every invocation has read the lanes before the next key writes
            _softmax_step(fn, t, fn.fmul(score, m.f(scale)), m_run, s_sum, acc, values, krow, t_id, table)
    inv = fn.load(s_sum)
    inv = fn.select(fn.fcmp(Op.FOrdEqual, inv, m.f(0.0)), m.f(0.0), fn.fdiv(m.f(1.0), inv))
    for c in range(chunks):
        fn.buf_store(out, fn.iadd(qbase, fn.iadd(t_id, m.u(64 * c))), fn.fmul(fn.load(acc[c]), inv))
    fn.end()
    name = f"attention_h{n_head}_kv{n_kv_head}_d{head_dim}"
    return Kernel(name, m.to_bytes(), (True, True, True, True, True, True, False), (WORKGROUP, 1, 1), push_size=4)


def _dot_tree(fn: Function, lanes) -> int:
    """ggml_vec_dot_f16's reduction of its 64 lanes (lane 16i + l is acc_i's lane l):
    (a0+a2)+(a1+a3), then halves 16 -> 8 -> 4, then (l0+l2)+(l1+l3)."""
    m = fn.m
    a = [fn.load(fn.shared_ptr(lanes, m.u(i))) for i in range(64)]
    v = [fn.fadd(fn.fadd(a[i], a[i + 32]), fn.fadd(a[i + 16], a[i + 48])) for i in range(16)]
    v = [fn.fadd(v[i + 8], v[i]) for i in range(8)]
    v = [fn.fadd(v[i + 4], v[i]) for i in range(4)]
    return fn.fadd(fn.fadd(v[0], v[2]), fn.fadd(v[1], v[3]))


def _softmax_step(fn: Function, t: Target, s: int, m_run: int, s_sum: int, acc: list[int], values, krow: int,
                  t_id: int, table) -> None:
    """One visible key of the online softmax (numerics.attention_online's loop body)."""
    m = fn.m
    m_old = fn.load(m_run)
    new_max = fn.fcmp(Op.FOrdGreaterThan, s, m_old)
    e = expf_libc(fn, table, fn.select(new_max, fn.fsub(m_old, s), fn.fsub(s, m_old)))
    ms, vs = fn.select(new_max, e, m.f(1.0)), fn.select(new_max, m.f(1.0), e)
    fn.store(m_run, fn.select(new_max, s, m_old))
    for c, a in enumerate(acc):
        v = _load_f16(fn, values, fn.iadd(krow, fn.iadd(t_id, m.u(64 * c))))
        scaled = _round_f16(fn, fn.fmul(fn.load(a), ms))
        fn.store(a, _round_f16(fn, builders.fma(fn, t, v, vs, scaled)))
    fn.store(s_sum, builders.fma(fn, t, fn.load(s_sum), ms, vs))
