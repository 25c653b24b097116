"""The compiled step's driver: one numba function that runs a whole tape of ops on every thread.

Owns: the machine code of the ops that are not matmuls (norms, rotary, attention, activations,
residual adds, KV stores) and the loop that walks a tape (kinetic.codegen.cpu.step builds it),
calling the generated matmul and quantizer kernels by address. Every thread runs the same tape and
takes its share of each op: row-local ops split rows, matmuls split output columns, attention splits
(row, head) pairs; a barrier follows an op only where the next one reads across that split. No op
ever splits a reduction, and each row's floats are the same sequence whatever the row count, the
grouping or the thread count: every op here repeats `kinetic.ir.numerics` (the reference) step by
step, with true fmas where the reference has fma_f32.
"""

from __future__ import annotations

import math

import numpy as np
from numba import carray, njit

from kinetic.codegen.cpu.native import (
    barrier,
    call_kernel,
    cycles,
    f16_bits,
    f16_value,
    f32_ptr,
    fma32,
    i8_ptr,
    pow2_f64,
    u16_ptr,
)
from kinetic.codegen.cpu.step_attention import attend_items

# numba's cache checks only this file's stamp, not those of the modules whose code it compiles in;
# this hash of them (kept current by tests/codegen/cpu/test_cpu_step.py) changes this file whenever
# they change, so a stale cache is never loaded.
SOURCES_HASH = "dcc0330f26ab30a7"

F32 = np.float32
F64 = np.float64

# op codes of the tape (column 0); column 1 holds flags, columns 2.. the arguments
OP_RMS_NORM = 1
OP_SCALE = 2
OP_ADD = 3
OP_MUL = 4
OP_SILU = 5
OP_GELU = 6
OP_SOFTCAP = 7
OP_SWIGLU = 8
OP_GEGLU = 9
OP_TAKE_ROWS = 11
OP_ROPE = 12
OP_QUANT = 13
OP_MATMUL = 14
OP_KV_STORE = 15
OP_ATTEND = 16
OP_EMBED = 20
OP_ROPE_TABLE = 21

EMBED_Q8_0, EMBED_F16, EMBED_F32 = 0, 1, 2  # OP_EMBED's table formats

FLAG_BARRIER = 1  # wait for every thread after this op
FLAG_OUTPUT_ROWS = 2  # the op works on the R output rows, not the T pass rows
FLAG_COLUMNS = 4  # a pass of fewer rows than threads: row-local ops split columns (tape[14] wide, in tape[15] units)
TAPE_WIDTH = 16
CHAINS = 8  # independent float64 sums an RMS norm advances together

_R23 = F32(float.fromhex("0x1.8p23"))
_LOG2E = F32(float.fromhex("0x1.715476p+0"))
_LN2_HI = F32(float.fromhex("0x1.62e4p-1"))
_LN2_LO = F32(float.fromhex("0x1.7f7d1cp-20"))
_C5 = F32(float.fromhex("0x1.0e4020p-7"))
_C4 = F32(float.fromhex("0x1.573e2ep-5"))
_C3 = F32(float.fromhex("0x1.555e66p-3"))
_C2 = F32(float.fromhex("0x1.fffdb6p-2"))
_C1 = F32(float.fromhex("0x1.ffffecp-1"))
_ONE = F32(1)
_ZERO = F32(0)
_INF = F32(np.inf)
_N_MIN = F32(-192)
_N_MAX = F32(192)


@njit(cache=True, inline="always", error_model="numpy")
def _fma(a, b, c):
    """numerics.fma_f32: a*b + c rounded once (the hardware fma)."""
    return fma32(a, b, c)


@njit(cache=True, inline="always", error_model="numpy")
def _expf_ggml(x):
    z = _fma(x, _LOG2E, _R23)
    n = z - _R23
    b = _fma(-n, _LN2_LO, _fma(-n, _LN2_HI, x))
    u = b * b
    j = _fma(_fma(_fma(_C5, b, _C4), u, _fma(_C3, b, _C2)), u, _fma(_C1, b, _ONE))
    clamped = n if n > _N_MIN else _N_MIN  # selects, not branches, so loops of it vectorize
    clamped = clamped if clamped < _N_MAX else _N_MAX
    scaled = F32(F64(j) * pow2_f64(np.int64(clamped)))  # ldexp(j, n), rounded once
    saturated = _ZERO if n <= _ZERO else _INF
    return saturated if (n > _N_MAX) | (n < _N_MIN) else scaled


@njit(cache=True, inline="always", error_model="numpy")
def _silu(x):
    return x / (_ONE + _expf_ggml(_ZERO - x))


@njit(cache=True, inline="always", error_model="numpy")
def _gelu(x, table):
    if x <= F32(-10):
        return _ZERO
    if x >= F32(10):
        return x
    return table[f16_bits(x)]


@njit(cache=True, inline="always", error_model="numpy")
def _share(n, tid, nt):
    return n * tid // nt, n * (tid + 1) // nt


@njit(cache=True, error_model="numpy")
def rope_angles(positions, half, step, freq_scale, out):
    """numerics.rope_angles into out f32 [len(positions) * half]: per row the angle starts at the
    position and is multiplied by step in float32 for each pair, then by freq_scale."""
    for r in range(positions.shape[0]):
        cur = F32(positions[r])
        for i in range(half):
            out[r * half + i] = freq_scale * cur
            cur = cur * step


@njit(cache=True, inline="always", error_model="numpy")
def _sum_squares(x0, x1, x2, x3, x4, x5, x6, x7, sums):
    """Eight sequential float64 sums of squares (each in its own order), side by side."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = F64(0)
    for i in range(x0.shape[0]):
        s0 += F64(x0[i] * x0[i])
        s1 += F64(x1[i] * x1[i])
        s2 += F64(x2[i] * x2[i])
        s3 += F64(x3[i] * x3[i])
        s4 += F64(x4[i] * x4[i])
        s5 += F64(x5[i] * x5[i])
        s6 += F64(x6[i] * x6[i])
        s7 += F64(x7[i] * x7[i])
    sums[0], sums[1], sums[2], sums[3] = s0, s1, s2, s3
    sums[4], sums[5], sums[6], sums[7] = s4, s5, s6, s7


@njit(cache=True, inline="always", error_model="numpy")
def _sum_squares_one(x):
    """One sequential float64 sum of squares: ggml's order (each square rounded to float32 first)."""
    s = F64(0)
    for i in range(x.shape[0]):
        s += F64(x[i] * x[i])
    return s


@njit(cache=True, inline="always", error_model="numpy")
def _sum_squares4(x0, x1, x2, x3, sums):
    """Four sequential float64 sums of squares side by side."""
    s0 = s1 = s2 = s3 = F64(0)
    for i in range(x0.shape[0]):
        s0 += F64(x0[i] * x0[i])
        s1 += F64(x1[i] * x1[i])
        s2 += F64(x2[i] * x2[i])
        s3 += F64(x3[i] * x3[i])
    sums[0], sums[1], sums[2], sums[3] = s0, s1, s2, s3


@njit(cache=True, error_model="numpy")
def rms_norm_rows(a, x, y, width, group, eps, w, wsize, r0, r1, c0, c1):
    """Rows r0..r1, writing columns c0..c1; each group's sum runs over the whole group, in order,
    in float64. The sums are sequential chains, so eight (rows or groups) advance side by side."""
    g_lo = c0 // group
    g_hi = (c1 + group - 1) // group
    per_row = g_hi - g_lo
    n = (r1 - r0) * per_row
    starts = np.empty(CHAINS, np.int64)
    sums = np.empty(CHAINS, np.float64)
    for base in range(0, n, CHAINS):
        k = min(CHAINS, n - base)
        for c in range(CHAINS):
            chain = base + min(c, k - 1)
            starts[c] = x + (r0 + chain // per_row) * width + (g_lo + chain % per_row) * group
        if k == 1:  # one chain (a decode row): eight copies of it would cost eight times the work
            sums[0] = _sum_squares_one(a[starts[0]: starts[0] + group])
        elif k <= 4:
            _sum_squares4(a[starts[0]: starts[0] + group], a[starts[1]: starts[1] + group],
                          a[starts[2]: starts[2] + group], a[starts[3]: starts[3] + group], sums)
        else:
            _sum_squares(a[starts[0]: starts[0] + group], a[starts[1]: starts[1] + group],
                         a[starts[2]: starts[2] + group], a[starts[3]: starts[3] + group],
                         a[starts[4]: starts[4] + group], a[starts[5]: starts[5] + group],
                         a[starts[6]: starts[6] + group], a[starts[7]: starts[7] + group], sums)
        for c in range(k):
            chain = base + c
            r = r0 + chain // per_row
            g0 = (g_lo + chain % per_row) * group
            mean = F32(sums[c] / group)
            scale = _ONE / np.sqrt(mean + eps)
            lo, hi = max(g0, c0), min(g0 + group, c1)
            xs = a[x + r * width + lo: x + r * width + hi]
            ys = a[y + r * width + lo: y + r * width + hi]
            if w < 0:
                for i in range(hi - lo):
                    ys[i] = xs[i] * scale
            elif lo % wsize + (hi - lo) <= wsize:  # one stretch of the weight (the usual case)
                ws = a[w + lo % wsize: w + lo % wsize + hi - lo]
                for i in range(hi - lo):
                    ys[i] = (xs[i] * scale) * ws[i]
            else:
                for i in range(hi - lo):
                    ys[i] = (xs[i] * scale) * a[w + (lo + i) % wsize]


@njit(cache=True, error_model="numpy")
def rope_rows(a, x, y, n_head, head_dim, n_rot, neox, cos, sin, r0, r1, h0, h1):
    width = n_head * head_dim
    half = n_rot // 2
    for r in range(r0, r1):
        for h in range(h0, h1):
            base = r * width + h * head_dim
            for i in range(half):
                c = a[cos + r * half + i]
                s = a[sin + r * half + i]
                i0 = i if neox else 2 * i
                i1 = i + half if neox else 2 * i + 1
                x0 = a[x + base + i0]
                x1 = a[x + base + i1]
                a[y + base + i0] = _fma(x0, c, -(x1 * s))
                a[y + base + i1] = _fma(x0, s, x1 * c)
            for i in range(n_rot, head_dim):
                a[y + base + i] = a[x + base + i]


@njit(cache=True, error_model="numpy")
def elementwise(op, xs, bs, ys, f0, f1, gelu):
    """One elementwise op over a thread's rows (slices, so the loops vectorize)."""
    n = ys.shape[0]
    if op == OP_ADD:
        for i in range(n):
            ys[i] = xs[i] + bs[i]
    elif op == OP_MUL:
        for i in range(n):
            ys[i] = xs[i] * bs[i]
    elif op == OP_SCALE:
        for i in range(n):
            ys[i] = xs[i] * f0
    elif op == OP_SILU:
        for i in range(n):
            ys[i] = _silu(xs[i])
    elif op == OP_GELU:
        for i in range(n):
            ys[i] = _gelu(xs[i], gelu)
    elif op == OP_SOFTCAP:
        for i in range(n):
            ys[i] = f0 * F32(math.tanh(xs[i] * f1))
    elif op == OP_SWIGLU:
        for i in range(n):
            ys[i] = _silu(xs[i]) * bs[i]
    elif op == OP_GEGLU:
        for i in range(n):
            ys[i] = _gelu(xs[i], gelu) * bs[i]


@njit(cache=True, error_model="numpy")
def embed_rows(a, table, row_bytes, y, width, kind, tokens, r0, r1, c0, c1):
    """Rows r0..r1 of the embedding (columns c0..c1, whole Q8_0 blocks) looked up by token:
    kinetic.ir.quants.dequantize's values (Q8_0: d * q in float32, one rounding)."""
    for r in range(r0, r1):
        base = table + np.int64(tokens[r]) * row_bytes
        out = a[y + r * width: y + (r + 1) * width]
        if kind == EMBED_Q8_0:
            for b in range(c0 // 32, c1 // 32):
                blk = base + 34 * b
                d = f16_value(carray(u16_ptr(blk), (1,))[0])
                q = carray(i8_ptr(blk + 2), (32,))
                for i in range(32):
                    out[32 * b + i] = d * F32(q[i])
        elif kind == EMBED_F16:
            h = carray(u16_ptr(base), (width,))
            for i in range(c0, c1):
                out[i] = f16_value(h[i])
        else:
            f = carray(f32_ptr(base), (width,))
            for i in range(c0, c1):
                out[i] = f[i]


@njit(cache=True, nogil=True, error_model="numpy")
def drive(tape, ftape, start, end, tid, nt, a, a_addr, n_rows, n_out, out_rows, tokens, positions, row_slot, row_cidx,
          slot_rows, anc, kv_addr, clen, cpos_addr, gelu, bar_addr, yield_addr, prof):
    """Run tape[start:end] as thread `tid` of `nt`; ends with a barrier. Returns the cycles this
    thread spent waiting for the others. Thread 0 adds each op's cycles to prof[ip, 0] and the
    cycles it then waited at the op's barrier to prof[ip, 1]."""
    waited = 0
    for ip in range(start, end):
        began = cycles()
        t = tape[ip]
        op = t[0]
        rows = n_out if t[1] & FLAG_OUTPUT_ROWS else n_rows
        r0, r1 = _share(rows, tid, nt)
        c0, c1 = 0, t[14]  # row-local ops: columns c0..c1 of rows r0..r1
        if t[1] & FLAG_COLUMNS and t[15] > 0:  # fewer rows than threads: split the columns instead
            r0, r1 = 0, rows
            units = (t[14] + t[15] - 1) // t[15]
            u0, u1 = _share(units, tid, nt)
            c0, c1 = min(u0 * t[15], t[14]), min(u1 * t[15], t[14])
        if op == OP_RMS_NORM:
            rms_norm_rows(a, t[2], t[3], t[4], t[5], F32(ftape[ip, 0]), t[6], t[7], r0, r1, c0, c1)
        elif op == OP_QUANT:
            x, width, fn, q, d, e, block, e_row = t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9]
            b0, b1 = c0 // block, c1 // block
            if c1 == width and c0 == 0:  # whole rows: one call
                if r1 > r0:
                    call_kernel(fn, a_addr + 4 * (x + r0 * width), q + r0 * width, d + 4 * r0 * (width // block),
                                  e + r0 * e_row, (r1 - r0) * (width // block))
            elif b1 > b0:
                e_block = e_row // (width // block)
                for r in range(r0, r1):
                    at = r * (width // block) + b0
                    call_kernel(fn, a_addr + 4 * (x + r * width + c0), q + r * width + c0, d + 4 * at,
                                  e + r * e_row + b0 * e_block, b1 - b0)
        elif op == OP_MATMUL:
            fn, w, q, d, e, y, n = t[2], t[3], t[4], t[5], t[6], t[7], t[8]
            n0, n1 = _share(n, tid, nt)
            if n1 > n0:
                call_kernel(fn, w, q, d, e, a_addr + 4 * y, rows, n0, n1, n)
        elif op == OP_ROPE:
            rope_rows(a, t[2], t[3], t[4], t[5], t[6], t[7] != 0, t[8], t[9], r0, r1, c0 // t[5], c1 // t[5])
        elif op == OP_KV_STORE:
            k, v, width, layer = t[2], t[3], t[4], t[5]
            for r in range(r0, r1):
                slot = row_slot[r]
                at = row_cidx[r] * width
                kc = carray(u16_ptr(kv_addr[slot, layer, 0]), (at + width,))
                vc = carray(u16_ptr(kv_addr[slot, layer, 1]), (at + width,))
                for i in range(c0, c1):
                    kc[at + i] = f16_bits(a[k + r * width + i])
                    vc[at + i] = f16_bits(a[v + r * width + i])
        elif op == OP_ATTEND:
            q, y, layer, n_head, n_kv, hd, window, score_fn = t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9]
            softmax_fn, heads, scale_bits, cap_bits = t[10], t[11], t[12], t[13]
            # every nt-th item: later rows of a prompt see more keys, so contiguous shares would not balance
            attend_items(a, q, y, kv_addr[:, layer, 0], kv_addr[:, layer, 1], n_kv * hd, n_head, n_kv, hd,
                         F32(ftape[ip, 0]), F32(ftape[ip, 1]), window, tid, rows * (n_head // heads), nt, positions,
                         row_slot, slot_rows, clen, cpos_addr, anc, score_fn, softmax_fn, heads, scale_bits, cap_bits)
        elif op == OP_EMBED:
            embed_rows(a, t[2], t[3], t[4], t[5], t[6], tokens, r0, r1, c0, c1)
        elif op == OP_ROPE_TABLE:
            angles, cos, sin, half, cos_fn, sin_fn = t[2], t[3], t[4], t[5], t[6], t[7]
            if c0 == 0 and r1 > r0:  # a column split gives the whole table to the thread holding column 0
                rope_angles(positions[r0:r1], half, F32(ftape[ip, 0]), F32(ftape[ip, 1]),
                            a[angles + r0 * half: angles + r1 * half])
                at, count = 4 * (angles + r0 * half), (r1 - r0) * half
                call_kernel(cos_fn, a_addr + at, a_addr + 4 * cos + 4 * r0 * half, count)
                call_kernel(sin_fn, a_addr + at, a_addr + 4 * sin + 4 * r0 * half, count)
        elif op == OP_TAKE_ROWS:
            x, y, width = t[2], t[3], t[4]
            for r in range(r0, r1):
                src = out_rows[r]
                for i in range(width):
                    a[y + r * width + i] = a[x + src * width + i]
        else:
            x, b, y, width = t[2], t[3], t[4], t[5]
            if c0 == 0 and c1 == width:
                elementwise(op, a[x + r0 * width: x + r1 * width], a[b + r0 * width: b + r1 * width],
                            a[y + r0 * width: y + r1 * width], F32(ftape[ip, 0]), F32(ftape[ip, 1]), gelu)
            else:
                for r in range(r0, r1):
                    o = r * width
                    elementwise(op, a[x + o + c0: x + o + c1], a[b + o + c0: b + o + c1], a[y + o + c0: y + o + c1],
                                F32(ftape[ip, 0]), F32(ftape[ip, 1]), gelu)
        wait = barrier(bar_addr, nt, yield_addr) if t[1] & FLAG_BARRIER else 0
        if tid == 0:
            prof[ip, 0] += cycles() - began - wait
            prof[ip, 1] += wait
        waited += wait
    return waited + barrier(bar_addr, nt, yield_addr)
