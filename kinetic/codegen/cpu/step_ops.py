"""The compiled step's ops: what one share of one tape instruction computes.

Owns: the machine code of the ops that are not matmuls (norms, rotary, attention, activations,
residual adds, KV stores) and `run_op`, one share of one instruction of a tape (rows laid out as
tape.py names them; lowering.py and tape_plan.py build it), calling the generated matmul and
quantizer kernels by address. Does not own the loop that walks the tape on every thread
(step_drive.drive). Every thread runs the same tape and
takes its share of each op: row-local ops split rows, matmuls split output columns, attention splits
(row, head) pairs; a barrier follows an op only where the next one reads across that split. No op
ever splits a reduction, and each row's floats are the same sequence whatever the row count, the
grouping or the thread count: every op here repeats `kinetic.ir.numerics` (the reference) step by
step, with true fmas where the reference has fma_f32."""

from __future__ import annotations

import math

import numpy as np
from numba import carray, njit

from kinetic.codegen.cpu import tape
from kinetic.codegen.cpu.moe_step import matmul_slots, quantize_slots
from kinetic.codegen.cpu.native import (
    call_kernel,
    f16_bits,
    f16_value,
    f32_ptr,
    fma32,
    i8_ptr,
    pow2_f64,
    u16_ptr,
)
from kinetic.codegen.cpu.step_attention import attend

# numba's cache checks only this file's stamp, not those of the modules whose code it compiles in;
# this hash of them (kept current by tests/codegen/cpu/test_cpu_step.py) changes this file whenever
# they change, so a stale cache is never loaded.
SOURCES_HASH = "6ba8ade8b9af580e"

F32 = np.float32
F64 = np.float64

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
def _span(n, s0, s1, nt):
    """Shares s0..s1-1 of n items split nt ways, together: share s is n*s//nt .. n*(s+1)//nt, so
    consecutive shares meet and their union is n*s0//nt .. n*s1//nt."""
    return n * s0 // nt, n * s1 // nt


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
    if op == tape.OP_ADD:
        for i in range(n):
            ys[i] = xs[i] + bs[i]
    elif op == tape.OP_MUL:
        for i in range(n):
            ys[i] = xs[i] * bs[i]
    elif op == tape.OP_SCALE:
        for i in range(n):
            ys[i] = xs[i] * f0
    elif op == tape.OP_SILU:
        for i in range(n):
            ys[i] = _silu(xs[i])
    elif op == tape.OP_GELU:
        for i in range(n):
            ys[i] = _gelu(xs[i], gelu)
    elif op == tape.OP_SOFTCAP:
        for i in range(n):
            ys[i] = f0 * F32(math.tanh(xs[i] * f1))
    elif op == tape.OP_SWIGLU:
        for i in range(n):
            ys[i] = _silu(xs[i]) * bs[i]
    elif op == tape.OP_GEGLU:
        for i in range(n):
            ys[i] = _gelu(xs[i], gelu) * bs[i]


@njit(cache=True, error_model="numpy")
def embed_rows(a, table, row_bytes, y, width, kind, tokens, r0, r1, c0, c1):
    """Rows r0..r1 of the embedding (columns c0..c1, whole Q8_0 blocks) looked up by token:
    kinetic.ir.quants.dequantize's values (Q8_0: d * q in float32, one rounding)."""
    for r in range(r0, r1):
        base = table + np.int64(tokens[r]) * row_bytes
        out = a[y + r * width: y + (r + 1) * width]
        if kind == tape.EMBED_Q8_0:
            for b in range(c0 // 32, c1 // 32):
                blk = base + 34 * b
                d = f16_value(carray(u16_ptr(blk), (1,))[0])
                q = carray(i8_ptr(blk + 2), (32,))
                for i in range(32):
                    out[32 * b + i] = d * F32(q[i])
        elif kind == tape.EMBED_F16:
            h = carray(u16_ptr(base), (width,))
            for i in range(c0, c1):
                out[i] = f16_value(h[i])
        else:
            f = carray(f32_ptr(base), (width,))
            for i in range(c0, c1):
                out[i] = f[i]


@njit(cache=True, nogil=True, error_model="numpy")
def run_op(int_rows, float_rows, ip, share, shares, a, a_addr, n_rows, n_out, out_rows, tokens, positions, row_slot,
           row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu):
    """Share `share` of `shares` of the tape's op `ip` (run_span of that one share)."""
    run_span(int_rows, float_rows, ip, share, share + 1, shares, a, a_addr, n_rows, n_out, out_rows, tokens, positions,
             row_slot, row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu)


@njit(cache=True, nogil=True, error_model="numpy")
def run_span(int_rows, float_rows, ip, share, end, shares, a, a_addr, n_rows, n_out, out_rows, tokens, positions,
             row_slot, row_cidx, slot_rows, anc, kv_addr, clen, cpos_addr, gelu):
    """Shares share..end-1 of `shares` of the tape's op `ip`: row-local ops a share of the rows (or
    of the columns), matmuls of the output columns (in units where the columns plan aligned them; of
    the rows, every column, under FLAG_SPLIT_ROWS), attention every shares-th (row, head) item.
    Consecutive shares of rows or columns are one contiguous range (_span), run as one call: the
    same bits as share by share, since no op splits a reduction and each row or column is computed
    alike in any call that covers it; attention and the MoE ops run share by share."""
    t = int_rows[ip]
    op = t[tape.OP]
    rows = n_out if t[tape.FLAGS] & tape.FLAG_OUTPUT_ROWS else n_rows
    r0, r1 = _span(rows, share, end, shares)
    width, unit = t[tape.WIDTH], t[tape.UNIT]
    c0, c1 = 0, width  # row-local ops: columns c0..c1 of rows r0..r1
    if t[tape.FLAGS] & tape.FLAG_COLUMNS and unit > 0:  # fewer rows than threads: split the columns instead
        r0, r1 = 0, rows
        u0, u1 = _span((width + unit - 1) // unit, share, end, shares)
        c0, c1 = min(u0 * unit, width), min(u1 * unit, width)
    if op == tape.OP_RMS_NORM:
        rms_norm_rows(a, t[tape.RMS_X], t[tape.RMS_Y], t[tape.RMS_WIDTH], t[tape.RMS_GROUP],
                      F32(float_rows[ip, tape.RMS_EPS]), t[tape.RMS_WEIGHT], t[tape.RMS_WEIGHT_SIZE],
                      r0, r1, c0, c1)
    elif op == tape.OP_QUANT:
        x, k, fn = t[tape.QUANT_X], t[tape.QUANT_WIDTH], t[tape.QUANT_KERNEL]
        q, d, e = t[tape.QUANT_Q], t[tape.QUANT_D], t[tape.QUANT_E]
        block, e_row = t[tape.QUANT_BLOCK], t[tape.QUANT_E_ROW]
        b0, b1 = c0 // block, c1 // block
        if c1 == k and c0 == 0:  # whole rows: one call
            if r1 > r0:
                call_kernel(fn, a_addr + 4 * (x + r0 * k), q + r0 * k, d + 4 * r0 * (k // block),
                            e + r0 * e_row, (r1 - r0) * (k // block))
        elif b1 > b0:
            e_block = e_row // (k // block)
            for r in range(r0, r1):
                at = r * (k // block) + b0
                call_kernel(fn, a_addr + 4 * (x + r * k + c0), q + r * k + c0, d + 4 * at,
                            e + r * e_row + b0 * e_block, b1 - b0)
    elif op == tape.OP_MATMUL:
        n = t[tape.MATMUL_N]
        n0, n1 = (c0, c1) if t[tape.FLAGS] & tape.FLAG_COLUMNS and unit > 0 else _span(n, share, end, shares)
        if t[tape.FLAGS] & tape.FLAG_SPLIT_ROWS:  # rows r0..r1, every column: the kernel from row r0 on
            if r1 > r0:
                call_kernel(t[tape.MATMUL_KERNEL], t[tape.MATMUL_WEIGHT], t[tape.MATMUL_Q] + r0 * t[tape.MATMUL_Q_ROW],
                            t[tape.MATMUL_D] + r0 * t[tape.MATMUL_D_ROW], t[tape.MATMUL_E] + r0 * t[tape.MATMUL_E_ROW],
                            a_addr + 4 * (t[tape.MATMUL_Y] + r0 * n), r1 - r0, 0, n, n)
        elif n1 > n0:
            call_kernel(t[tape.MATMUL_KERNEL], t[tape.MATMUL_WEIGHT], t[tape.MATMUL_Q], t[tape.MATMUL_D],
                        t[tape.MATMUL_E], a_addr + 4 * t[tape.MATMUL_Y], rows, n0, n1, n)
    elif op == tape.OP_ROPE:
        hd = t[tape.ROPE_HEAD_DIM]
        rope_rows(a, t[tape.ROPE_X], t[tape.ROPE_Y], t[tape.ROPE_N_HEAD], hd, t[tape.ROPE_N_ROT],
                  t[tape.ROPE_NEOX] != 0, t[tape.ROPE_COS], t[tape.ROPE_SIN], r0, r1, c0 // hd, c1 // hd)
    elif op == tape.OP_KV_STORE:
        k, v, kv_width, layer = t[tape.KV_K], t[tape.KV_V], t[tape.KV_WIDTH], t[tape.KV_LAYER]
        for r in range(r0, r1):
            slot = row_slot[r]
            at = row_cidx[r] * kv_width
            kc = carray(u16_ptr(kv_addr[slot, layer, 0]), (at + kv_width,))
            vc = carray(u16_ptr(kv_addr[slot, layer, 1]), (at + kv_width,))
            for i in range(c0, c1):
                kc[at + i] = f16_bits(a[k + r * kv_width + i])
                vc[at + i] = f16_bits(a[v + r * kv_width + i])
    elif op == tape.OP_ATTEND:
        layer, n_head, n_kv = t[tape.ATTEND_LAYER], t[tape.ATTEND_N_HEAD], t[tape.ATTEND_N_KV_HEAD]
        hd, heads = t[tape.ATTEND_HEAD_DIM], t[tape.ATTEND_HEADS]
        for s in range(share, end):  # a share's items are every shares-th: not contiguous
            attend(a, t[tape.ATTEND_Q], t[tape.ATTEND_Y], kv_addr[:, layer, 0], kv_addr[:, layer, 1], n_kv * hd,
                   n_head, n_kv, hd, F32(float_rows[ip, tape.ATTEND_SCALE]), F32(float_rows[ip, tape.ATTEND_CAP]),
                   t[tape.ATTEND_WINDOW], s, shares, rows, positions, row_slot, slot_rows, clen, cpos_addr, anc,
                   t[tape.ATTEND_SCORE_KERNEL], t[tape.ATTEND_SOFTMAX_KERNEL], heads, t[tape.ATTEND_TILE_KERNEL],
                   t[tape.ATTEND_SCALE_BITS], t[tape.ATTEND_CAP_BITS], t[tape.ATTEND_F32_ACC] != 0)
    elif op == tape.OP_EMBED:
        embed_rows(a, t[tape.EMBED_TABLE], t[tape.EMBED_ROW_BYTES], t[tape.EMBED_Y], t[tape.EMBED_WIDTH],
                   t[tape.EMBED_KIND], tokens, r0, r1, c0, c1)
    elif op == tape.OP_ROPE_TABLE:
        angles, cos, sin, half = t[tape.TABLE_ANGLES], t[tape.TABLE_COS], t[tape.TABLE_SIN], t[tape.TABLE_HALF]
        if c0 == 0 and r1 > r0:  # a column split gives the whole table to the thread holding column 0
            rope_angles(positions[r0:r1], half, F32(float_rows[ip, tape.TABLE_STEP]),
                        F32(float_rows[ip, tape.TABLE_FREQ_SCALE]), a[angles + r0 * half: angles + r1 * half])
            at, count = 4 * (angles + r0 * half), (r1 - r0) * half
            call_kernel(t[tape.TABLE_COSF], a_addr + at, a_addr + 4 * cos + 4 * r0 * half, count)
            call_kernel(t[tape.TABLE_SINF], a_addr + at, a_addr + 4 * sin + 4 * r0 * half, count)
    elif op == tape.OP_TAKE_ROWS:
        x, y, take_width = t[tape.TAKE_X], t[tape.TAKE_Y], t[tape.TAKE_WIDTH]
        for r in range(r0, r1):
            src = out_rows[r]
            for i in range(take_width):
                a[y + r * take_width + i] = a[x + src * take_width + i]
    elif op == tape.OP_COLUMNS:
        x, y, x_width, first = t[tape.COLS_X], t[tape.COLS_Y], t[tape.COLS_X_WIDTH], t[tape.COLS_START]
        for r in range(r0, r1):
            for i in range(c0, c1):
                a[y + r * width + i] = a[x + r * x_width + first + i]
    elif op == tape.OP_ADD_BIAS:
        x, y, bias_width = t[tape.BIAS_X], t[tape.BIAS_Y], t[tape.BIAS_WIDTH]
        bias = a[t[tape.BIAS_B] + c0: t[tape.BIAS_B] + c1]
        for r in range(r0, r1):
            o = r * bias_width
            elementwise(tape.OP_ADD, a[x + o + c0: x + o + c1], bias, a[y + o + c0: y + o + c1], F32(0), F32(0),
                        gelu)
    elif op == tape.OP_LAYER_NORM:
        k, w = t[tape.NORM_WIDTH], t[tape.NORM_WEIGHT]
        if c1 > c0 and r1 > r0:  # UNIT = WIDTH: a column split gives each row whole to one share
            call_kernel(t[tape.NORM_KERNEL], a_addr + 4 * (t[tape.NORM_X] + r0 * k),
                        a_addr + 4 * (t[tape.NORM_Y] + r0 * k), a_addr + 4 * w if w >= 0 else 0, r1 - r0)
    elif op == tape.OP_ROW_KERNEL:
        b = t[tape.ROWK_B]
        if c1 > c0 and r1 > r0:  # UNIT = WIDTH: a column split gives each row whole to one share
            call_kernel(t[tape.ROWK_KERNEL], a_addr + 4 * t[tape.ROWK_X], a_addr + 4 * b if b >= 0 else 0,
                        a_addr + 4 * t[tape.ROWK_Y], r0, r1)
    elif op == tape.OP_MOE_QUANT:
        for s in range(share, end):
            quantize_slots(t[tape.MOE_PARAMS], a, a_addr, t[tape.MOE_X], t[tape.MOE_IDS], t[tape.MOE_Q],
                           t[tape.MOE_D], t[tape.MOE_E], rows, s, shares)
    elif op == tape.OP_MOE_MATMUL:
        for s in range(share, end):
            matmul_slots(t[tape.MOE_PARAMS], a, a_addr, t[tape.MOE_IDS], t[tape.MOE_Q], t[tape.MOE_D],
                         t[tape.MOE_E], t[tape.MOE_Y], t[tape.MOE_SCRATCH], rows, s, shares)
    else:  # elementwise
        x, b, y, ew_width = t[tape.EW_X], t[tape.EW_B], t[tape.EW_Y], t[tape.EW_WIDTH]
        f0, f1 = F32(float_rows[ip, tape.EW_F0]), F32(float_rows[ip, tape.EW_F1])
        if c0 == 0 and c1 == ew_width:
            elementwise(op, a[x + r0 * ew_width: x + r1 * ew_width], a[b + r0 * ew_width: b + r1 * ew_width],
                        a[y + r0 * ew_width: y + r1 * ew_width], f0, f1, gelu)
        else:
            for r in range(r0, r1):
                o = r * ew_width
                elementwise(op, a[x + o + c0: x + o + c1], a[b + o + c0: b + o + c1], a[y + o + c0: y + o + c1],
                            f0, f1, gelu)
