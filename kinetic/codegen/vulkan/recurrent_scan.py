"""The Vulkan kernels of the ops that carry a recurrent state: lfm2's and Mamba-2's short convolution
(`render_short_conv`), Mamba-2's selective scan (`render_ssm_scan`, granitehybrid and falcon-h1) and
Gated DeltaNet's delta rule (`render_delta_rule`, qwen35).

Owns: each op's arithmetic for one state row, in the reference's order. short_conv:
numerics.recurrent.short_conv_row (taps ascending from 0, chunks of 16 then 8 as rounded products
added, the rest one fma each). ssm_scan: numerics.recurrent.ssm_scan_row plus x * D (per head sp =
softplus(dt), dA = expf(sp * A), x_dt = x * sp; each state value fma(s, dA, B * x_dt); y its dot with
C) . delta_rule: kinetic/ir/delta_reference.py's step (the decay expf(softplus(alpha) * A), the
strength sigmoid(beta); the row scaled, delta = (v - dot(row, k)) * strength, the row updated by one
fma a value, out = dot(row, q) / sqrt(S)). The dots are ggml_vec_dot_f32's as llama.cpp's AVX-512
build runs it (`_dot`). Every f32 fma is builders.fma (rounding once on every device), every add
that may meet a constant zero builders.add, expf and logf the C library's (attention.expf_libc,
logf.py). Does not own the meaning (kinetic/ir/numerics/recurrent.py), which state a row starts from
or keeping states between passes (the runtime stages them: pass_states.py).

The walk: one invocation per state row (a conv channel; a scan channel's d_state values; a value row
of a head's S x S matrix) walks the pass's rows in order (a parent comes before its children). Its
states live in one buffer `walk`, f32 [2T, state size]: rows 0..T-1 hold, for each row without a
parent in the pass, its sequence's committed state (the host writes them), rows T..2T-1 the state
after each row (this kernel writes them). Row r starts from walk[T + parent] when it has a parent in
the pass, else from walk[r], so a row's output and state depend only on its own path: a batch gives
each row what it gets alone and a tree row what its path gives. A state row's values
are read back from `walk` where the kernel wrote them: the per-value steps and the dots are loops
(the dot's 64 lanes a local array), so a shader stays small whatever the state size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from kinetic.codegen.vulkan import builders
from kinetic.codegen.vulkan.attention import expf_libc
from kinetic.codegen.vulkan.builders import Target
from kinetic.codegen.vulkan.device import Kernel
from kinetic.codegen.vulkan.elementwise import flat_index
from kinetic.codegen.vulkan.logf import softplus
from kinetic.codegen.vulkan.spirv import Function, Module, Op, StorageClass

WORKGROUP = 64  # state rows per workgroup: each invocation walks every row of the pass
LANES = 64  # ggml's GGML_F32_STEP on AVX-512: 4 vectors of 16
NO_PARENT = 0xFFFFFFFF  # -1 as the parents buffer holds it (i32 bits in u32 words)


@contextmanager
def _walk(fn: Function, params: int, parents, rows_total: int) -> Iterator[tuple[int, int, int, int]]:
    """For state row `ch` below rows_total, each pass row r in order: yields (ch, r, the walk row it
    starts from, the walk row it writes)."""
    m = fn.m
    ch = flat_index(fn, WORKGROUP)
    n_rows = fn.push(params, 0, m.u32)
    with fn.if_(fn.icmp(Op.ULessThan, ch, m.u(rows_total))), fn.loop(m.u(0), n_rows) as r:
        parent = fn.buf_load(parents, r)
        start = fn.select(fn.icmp(Op.IEqual, parent, m.u(NO_PARENT)), r, fn.iadd(n_rows, parent))
        yield ch, r, start, fn.iadd(n_rows, r)


def _at(fn: Function, base: int, offset: int) -> int:
    """base + offset (a u32 id plus a Python int)."""
    return fn.iadd(base, fn.m.u(offset)) if offset else base


def _entry(m: Module, names: list[str]) -> tuple[list, object, object, object, int, Function]:
    """Bindings: the read-only inputs `names` in order, parents u32 [T], walk f32 [2T, *], out f32;
    push constant: the pass's rows."""
    ins = [m.storage_buffer(i, m.f32 if name != "expf_table" else m.u32, readonly=True, name=name)
           for i, name in enumerate(names)]
    parents = m.storage_buffer(len(names), m.u32, readonly=True, name="parents")
    walk = m.storage_buffer(len(names) + 1, m.f32, name="walk")
    out = m.storage_buffer(len(names) + 2, m.f32, name="out")
    params, _ = m.push_constants([m.u32])
    return ins, parents, walk, out, params, m.compute_entry((WORKGROUP, 1, 1))


def _kernel(name: str, m: Module, n_inputs: int) -> Kernel:
    return Kernel(name, m.to_bytes(), (True,) * (n_inputs + 1) + (False, False), (WORKGROUP, 1, 1), push_size=4)


def render_short_conv(t: Target, channels: int, taps: int) -> Kernel:
    """out f32 [T, C]: each channel's dot of its taps (w f32 [C, K]) with its window along the row's
    path, the state's K - 1 values then the row's own (x f32 [T, C]); the state rs[K-1, C] a row
    leaves is its window's last K - 1 values. Bindings: x, w, parents, walk, out."""
    m = Module()
    (x, w), parents, walk, out, params, fn = _entry(m, ["x", "w"])
    width = (taps - 1) * channels
    with _walk(fn, params, parents, channels) as (c, r, start, after):
        wt = [fn.buf_load(w, _at(fn, fn.imul(c, m.u(taps)), k)) for k in range(taps)]
        first, written = fn.iadd(fn.imul(start, m.u(width)), c), fn.iadd(fn.imul(after, m.u(width)), c)
        win = [fn.buf_load(walk, _at(fn, first, k * channels)) for k in range(taps - 1)]
        win.append(fn.buf_load(x, fn.iadd(fn.imul(r, m.u(channels)), c)))
        acc, tap = m.f(0.0), 0
        while taps - tap >= 16:
            tap += 16
        if taps - tap >= 8:
            tap += 8
        for k in range(tap):  # the chunks of 16 and 8: rounded products added in tap order
            acc = builders.add(fn, acc, fn.fmul(win[k], wt[k]))
        for k in range(tap, taps):
            acc = builders.fma(fn, t, win[k], wt[k], acc)
        fn.buf_store(out, fn.iadd(fn.imul(r, m.u(channels)), c), acc)
        for k in range(taps - 1):
            fn.buf_store(walk, _at(fn, written, k * channels), win[k + 1])
    fn.end()
    return _kernel(f"short_conv_c{channels}_k{taps}", m, 2)


def _dot(fn: Function, t: Target, load_a: Callable[[int], int], load_b: Callable[[int], int], n: int, *,
         ggml_tail: bool) -> int:
    """The dot of a and b over s < n (load_a(s), load_b(s): f32 ids of a u32 id s) in the reference's
    order: 64 fma lanes over whole chunks of 64 (lane l: values l, l + 64, ...; a loop per lane into a
    local array), ggml's reduction ((l_j + l_32+j) + (l_16+j + l_48+j), then halving 16 -> 8 -> 4,
    then (v0 + v2) + (v1 + v3)), then the tail: one fma each, or with ggml_tail ggml_vec_dot_f32's
    (rounded products added up to the last whole 8 first, the rest one fma each)."""
    m = fn.m
    main = n - n % LANES
    v: list[int] = [m.f(0.0)] * LANES
    if main:
        lanes = fn.local(m.array(m.f32, LANES))
        with fn.loop(m.u(0), m.u(LANES)) as lane:
            acc = fn.local(m.f32, m.f(0.0))
            with fn.loop(lane, m.u(main), LANES) as s:
                fn.store(acc, builders.fma(fn, t, load_a(s), load_b(s), fn.load(acc)))
            fn.store(fn.emit(Op.AccessChain, m.pointer(StorageClass.Function, m.f32), lanes, lane), fn.load(acc))
        v = [fn.load(fn.emit(Op.AccessChain, m.pointer(StorageClass.Function, m.f32), lanes, m.u(j)))
             for j in range(LANES)]

    def add(x: int, y: int) -> int:
        return builders.add(fn, x, y)

    v = [add(add(v[j], v[32 + j]), add(v[16 + j], v[48 + j])) for j in range(16)]
    v = [add(v[8 + j], v[j]) for j in range(8)]
    v = [add(v[4 + j], v[j]) for j in range(4)]
    total = fn.local(m.f32, add(add(v[0], v[2]), add(v[1], v[3])))
    rest = n - main
    unfused = main + rest // 16 * 16 + (8 if rest % 16 >= 8 else 0) if ggml_tail else main
    if unfused > main:
        with fn.loop(m.u(main), m.u(unfused)) as s:
            fn.store(total, add(fn.load(total), fn.fmul(load_a(s), load_b(s))))
    if n > unfused:
        with fn.loop(m.u(unfused), m.u(n)) as s:
            fn.store(total, builders.fma(fn, t, load_a(s), load_b(s), fn.load(total)))
    return fn.load(total)


def render_ssm_scan(t: Target, n_head: int, head_dim: int, n_group: int, d_state: int) -> Kernel:
    """out f32 [T, n_head*head_dim] from x (same shape), dt f32 [T, n_head], A, D f32 [n_head], B, C f32
    [T, n_group*d_state]; the state rs[n_head*head_dim, d_state]; one invocation per channel (head,
    value). Bindings: x, dt, A, B, C, D, the expf table u32 [64], parents, walk, out."""
    m = Module()
    (x, dt, a_buf, b_buf, c_buf, d_buf, table), parents, walk, out, params, fn = _entry(
        m, ["x", "dt", "A", "B", "C", "D", "expf_table"])
    channels, width = n_head * head_dim, n_head * head_dim * d_state
    with _walk(fn, params, parents, channels) as (ch, r, start, after):
        h = fn.udiv(ch, m.u(head_dim))
        g = fn.udiv(h, m.u(n_head // n_group))
        a, d = fn.buf_load(a_buf, h), fn.buf_load(d_buf, h)
        sp = softplus(fn, table, fn.buf_load(dt, fn.iadd(fn.imul(r, m.u(n_head)), h)))
        decay = expf_libc(fn, table, fn.fmul(sp, a))
        xv = fn.buf_load(x, fn.iadd(fn.imul(r, m.u(channels)), ch))
        x_dt = fn.fmul(xv, sp)
        bc = fn.iadd(fn.imul(r, m.u(n_group * d_state)), fn.imul(g, m.u(d_state)))
        first = fn.iadd(fn.imul(start, m.u(width)), fn.imul(ch, m.u(d_state)))
        written = fn.iadd(fn.imul(after, m.u(width)), fn.imul(ch, m.u(d_state)))
        with fn.loop(m.u(0), m.u(d_state)) as s:
            new = builders.fma(fn, t, fn.buf_load(walk, fn.iadd(first, s)), decay,
                               fn.fmul(fn.buf_load(b_buf, fn.iadd(bc, s)), x_dt))
            fn.buf_store(walk, fn.iadd(written, s), new)
        y = _dot(fn, t, lambda s: fn.buf_load(walk, fn.iadd(written, s)), lambda s: fn.buf_load(c_buf, fn.iadd(bc, s)),
                 d_state, ggml_tail=False)
        fn.buf_store(out, fn.iadd(fn.imul(r, m.u(channels)), ch), builders.add(fn, y, fn.fmul(xv, d)))
    fn.end()
    return _kernel(f"ssm_scan_h{n_head}_d{head_dim}_g{n_group}_s{d_state}", m, 7)


def render_delta_rule(t: Target, n_k_head: int, n_v_head: int, head_dim: int) -> Kernel:
    """out f32 [T, n_v_head*S] from q, k f32 [T, n_k_head*S], v f32 [T, n_v_head*S], alpha, beta f32
    [T, n_v_head], A f32 [n_v_head]; the state rs[n_v_head*S, S]; one invocation per value row (head
    h, row j), reading key head h % n_k_head. Bindings: q, k, v, alpha, beta, A, the expf table u32
    [64], parents, walk, out."""
    m = Module()
    (q, k, v, alpha, beta, a_buf, table), parents, walk, out, params, fn = _entry(
        m, ["q", "k", "v", "alpha", "beta", "A", "expf_table"])
    size = head_dim
    rows_total, width = n_v_head * size, n_v_head * size * size
    scale = m.f(float(np.float32(1) / np.float32(np.sqrt(np.float32(size)))))
    with _walk(fn, params, parents, rows_total) as (ch, r, start, after):
        h = fn.udiv(ch, m.u(size))
        kh = fn.umod(h, m.u(n_k_head))
        head = fn.iadd(fn.imul(r, m.u(n_v_head)), h)
        decay = expf_libc(fn, table, fn.fmul(softplus(fn, table, fn.buf_load(alpha, head)), fn.buf_load(a_buf, h)))
        e = expf_libc(fn, table, fn.fsub(m.f(0.0), fn.buf_load(beta, head)))
        strength = fn.fdiv(m.f(1.0), fn.fadd(m.f(1.0), e))
        kq = fn.iadd(fn.imul(r, m.u(n_k_head * size)), fn.imul(kh, m.u(size)))
        first = fn.iadd(fn.imul(start, m.u(width)), fn.imul(ch, m.u(size)))
        written = fn.iadd(fn.imul(after, m.u(width)), fn.imul(ch, m.u(size)))

        def state(s: int) -> int:  # value s of the row's state being written (decayed, then updated)
            return fn.buf_load(walk, fn.iadd(written, s))

        def key(s: int) -> int:
            return fn.buf_load(k, fn.iadd(kq, s))

        with fn.loop(m.u(0), m.u(size)) as s:
            fn.buf_store(walk, fn.iadd(written, s), fn.fmul(fn.buf_load(walk, fn.iadd(first, s)), decay))
        kdot = _dot(fn, t, state, key, size, ggml_tail=True)
        value = fn.buf_load(v, fn.iadd(fn.imul(r, m.u(rows_total)), ch))
        delta = fn.fmul(fn.fsub(value, kdot), strength)
        with fn.loop(m.u(0), m.u(size)) as s:
            fn.buf_store(walk, fn.iadd(written, s), builders.fma(fn, t, key(s), delta, state(s)))
        qdot = _dot(fn, t, state, lambda s: fn.buf_load(q, fn.iadd(kq, s)), size, ggml_tail=True)
        fn.buf_store(out, fn.iadd(fn.imul(r, m.u(rows_total)), ch), fn.fmul(qdot, scale))
    fn.end()
    return _kernel(f"delta_rule_k{n_k_head}_v{n_v_head}_s{size}", m, 7)
