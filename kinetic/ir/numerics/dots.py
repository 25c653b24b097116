"""The reference matmul: activation rows against a decoded weight, in ggml's order of summation.

Owns: `matmul` and the dots it is made of. Each activation row is its own matrix-vector product, so
a row's result never depends on which other rows share the pass. Block-32 "lanes" weights follow
ggml's vec-dots exactly (_lane_dot), Q4_K / Q6_K the repacked Q4_K gemv and the Q6_K vec-dot
(_superblock_dot), Q2_K, Q3_K, Q5_K, Q4_0, IQ4_NL, IQ4_XS, MXFP4 their kernels' float order on
`quant_dots`' integer parts (_parts_dot), and F16 / BF16 / F32 weights ggml_vec_dot_{f16,bf16,f32}
(float_dot); other quantized weights are a float32 product of the dequantized operands (the same
integers, another summation order). In the fast order ("block_chain", kinetic/ir/orders.py) Q8_0,
Q5_0, Q4_1 and Q5_1 sum as one float chain of whole-block dots (_block_chain_dot), Q6_K, Q5_K, Q3_K
and IQ4_XS as one fma per super-block of its exact integer dot (_q6k_chain_dot, _parts_chain in
"scalar"; Q4_K's order). Does not own
decoding weights (weights.py), quantizing activations (activations.py) or which order a node takes
(kinetic/ir/orders.py).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic.ir import quant_dots
from kinetic.ir.numerics.activations import (
    FLOAT_WEIGHTS,
    activation_format,
    q8_1_sums,
    quantize_q8_0,
    quantize_q8_k,
    quantized_activations,
)
from kinetic.ir.numerics.floats import F32, fma_f32
from kinetic.ir.numerics.weights import DequantizedWeight
from kinetic.ir.op_groups.checks import VerifyError
from kinetic.ir.orders import weight_order

_LANE_ROWS = 16  # activation rows per step of the lane-ordered dot


def _lane_dot(w: DequantizedWeight, qx: np.ndarray, dx: np.ndarray, sx: np.ndarray | None) -> np.ndarray:
    """Activation rows (q int8 [R, K/32, 32], d f32 [R, K/32], Q8_1 s f32 [R, K/32] or None) against
    every weight row, in the order of ggml's block-32 kernels (see LANE_TYPES): f32 [R, n_out].
    Rows never mix: each lane sum is exact (|sum| <= 4*127*127) whatever the order, and the float
    accumulation runs elementwise per row."""
    groups, n_out, _ = w.lanes.shape
    rows, nb = dx.shape
    xg = qx.reshape(rows, groups, 4).astype(F32).transpose(1, 2, 0)  # [G, 4, R]
    scale = (w.scales.T[:, :, None] * dx.T[:, None, :]).astype(F32)  # d_w * d_x [nb, n, R]
    acc = np.zeros((8, n_out, rows), F32)
    tmp = np.empty((8, n_out, rows), np.float64)
    for b in range(nb):
        lanes = np.matmul(w.lanes[8 * b : 8 * b + 8], xg[8 * b : 8 * b + 8])  # [8, n, R] exact sums
        np.multiply(lanes, scale[b][None], out=tmp, dtype=np.float64)  # exact in float64
        tmp += acc
        acc[...] = tmp  # one rounding to float32: the fma
    half = (acc[4:] + acc[:4]).astype(F32)
    total = ((half[0] + half[2]).astype(F32) + (half[1] + half[3]).astype(F32)).astype(F32).T  # [R, n]
    if sx is not None:
        summs = np.zeros((rows, n_out), F32)
        for b in range(nb):
            summs = (summs + (w.minimums[None, :, b] * sx[:, None, b]).astype(F32)).astype(F32)
        total = (total + summs).astype(F32)
    return total


def _superblock_dot(w: DequantizedWeight, qx: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """Activation rows (Q8_K: q int8 [R, nsb, 256], d f32 [R, nsb]) against Q4_K / Q6_K weights in
    the order of ggml's x86 kernels: f32 [R, n_out]. Integer parts are exact (float64 products of
    integers below 2^53); the float steps are ggml's, elementwise per row.

    Q4_K (repacked on AVX2 machines, arch/x86/repack.cpp ggml_gemv_q4_K_8x8_q8_K): per super-block
    iacc = sum sc*q*qx and imin = sum m*bsum32 as int32, acc = fma(f32(iacc), d_w*d_x, acc),
    accmin = fma(f32(imin), dmin_w*d_x, accmin); result acc - accmin.
    Q6_K (arch/x86/quants.c ggml_vec_dot_q6_K_q8_K): 8 int32 lanes per super-block (see
    DequantizedWeight._superblock_parts), acc_l = fma(d_x*d_w, f32(lane_l), acc_l), then
    hsum_float_8."""
    n_out, nsb, _ = w.k_weights.shape
    rows = qx.shape[0]
    xq = qx.reshape(rows, nsb, 256).astype(np.float64)
    if w.type is Q.Q4_K:
        iacc = np.einsum("nbk,rbk->rnb", w.k_weights, xq, optimize=True)  # exact integers
        bsum = xq.reshape(rows, nsb, 8, 32).sum(axis=3)
        imin = np.einsum("nbs,rbs->rnb", w.k_mins, bsum, optimize=True)
        acc = np.zeros((rows, n_out), F32)
        accmin = np.zeros((rows, n_out), F32)
        for b in range(nsb):
            dd = (w.k_d[None, :, b] * dx[:, None, b]).astype(F32)
            dm = (w.k_dmin[None, :, b] * dx[:, None, b]).astype(F32)
            acc = (iacc[:, :, b].astype(F32).astype(np.float64) * dd + acc).astype(F32)
            accmin = (imin[:, :, b].astype(F32).astype(np.float64) * dm + accmin).astype(F32)
        return (acc - accmin).astype(F32)
    xp = xq[:, :, w.k_perm].reshape(rows, nsb, 8, 32)
    wl = w.k_weights.reshape(n_out, nsb, 8, 32)
    lanes = np.einsum("nblk,rblk->rnbl", wl, xp, optimize=True)
    offsets = w.k_offsets.reshape(n_out, nsb, 8, 32)
    lanes -= np.einsum("nblk,rblk->rnbl", offsets, xq.reshape(rows, nsb, 8, 32), optimize=True)
    acc = np.zeros((rows, n_out, 8), F32)
    for b in range(nsb):
        dd = (dx[:, None, b] * w.k_d[None, :, b]).astype(F32).astype(np.float64)
        acc = (lanes[:, :, b, :].astype(F32).astype(np.float64) * dd[..., None] + acc).astype(F32)
    half = (acc[..., 4:] + acc[..., :4]).astype(F32)
    return ((half[..., 0] + half[..., 2]).astype(F32) + (half[..., 1] + half[..., 3]).astype(F32)).astype(F32)


def _q6k_chain_dot(w: DequantizedWeight, qx: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """Activation rows (Q8_K: q int8 [R, nsb, 256], d f32 [R, nsb]) against Q6_K weights in the fast
    order "block_chain": f32 [R, n_out]. Per super-block the exact integer sum_j sc_j * sum_i (q_i - 32)
    * x_i over its 16 sub-blocks (|isum| < 2^28: exact in float64), then
    acc = fma(f32(isum), f32(d_w * d_x), acc) in super-block order."""
    n_out, nsb, _ = w.k_weights.shape
    rows = qx.shape[0]
    xq = qx.reshape(rows, nsb, 256).astype(np.float64)
    isum = np.einsum("nbk,rbk->rnb", w.k_weights, xq[:, :, w.k_perm], optimize=True)
    isum -= np.einsum("nbk,rbk->rnb", w.k_offsets, xq, optimize=True)
    acc = np.zeros((rows, n_out), F32)
    for b in range(nsb):
        dd = (dx[:, None, b] * w.k_d[None, :, b]).astype(F32)
        acc = _fused(isum[:, :, b].astype(F32), dd, acc)
    return acc


def _parts_dot(p: quant_dots.IntegerParts, qx: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """Activation rows (q int8 [R, nb, block], d f32 [R, nb]) against Q2_K, Q3_K, Q5_K, IQ4_NL,
    IQ4_XS or MXFP4 weights in the float order of ggml's x86 kernels (quant_dots): f32 [R, n_out].
    Per block: the exact integer lanes (one float64 product per lane) converted to f32, then
    acc = fma(f32(ints), d_x*d_w, acc). "lanes" (vec_dot): hsum_float_8(acc), Q5_K plus
    summs = fma(-(d_x*dmin_w), f32(imin), summs) (GCC contracts `summs += dmin * isum`).
    "scalar" (repacked gemv): acc, Q2_K minus accmin = fma(f32(imin), dmin_w*d_x, accmin).
    imin = sum_j min_j * (Q8_K sum of 16 j), exact."""
    return _parts_chain(p, qx, dx, p.order)


def _parts_chain(p: quant_dots.IntegerParts, qx: np.ndarray, dx: np.ndarray, order: str) -> np.ndarray:
    """_parts_dot in the float order `order`: "lanes" or "scalar" (a "lanes" type in "scalar" is the
    fast order "block_chain": the lanes' exact integers summed per super-block before the one fma)."""
    n, nb, lanes, pos = p.weights.shape
    rows = qx.shape[0]
    xb = qx.reshape(rows, nb, p.block)[:, :, p.perm].reshape(rows, nb, lanes, pos)
    xb = xb.astype(np.float64).transpose(1, 2, 0, 3)  # [nb, lanes, R, pos]
    acc = np.zeros((rows, n, lanes if order == "lanes" else 1), F32)
    accm = np.zeros((rows, n), F32)
    bsums = qx.reshape(rows, nb, -1, 16).astype(np.float64).sum(axis=3) if p.mins is not None else None
    for b in range(nb):
        wb = p.weights[:, b].astype(np.float64).transpose(1, 2, 0)  # [lanes, pos, n]
        ints = np.matmul(xb[b], wb).transpose(1, 2, 0)  # [R, n, lanes]: exact
        if order == "scalar" and lanes > 1:  # the block's integer total (exact below 2^53)
            ints = ints.sum(axis=2, keepdims=True)
        ints = ints.astype(F32)  # cvtdq2ps
        dd = (dx[:, None, b] * p.d[None, :, b]).astype(F32)
        acc = fma_f32(ints, dd[..., None], acc)
        if bsums is not None:
            imin = (bsums[:, b] @ p.mins[:, b].astype(np.float64).T).astype(F32)
            dm = (dx[:, None, b] * p.dmin[None, :, b]).astype(F32)
            accm = fma_f32(imin, dm, accm) if order == "scalar" else fma_f32(-dm, imin, accm)
    if order == "scalar":
        return acc[..., 0] if bsums is None else (acc[..., 0] - accm).astype(F32)
    half = (acc[..., 4:] + acc[..., :4]).astype(F32)
    y = ((half[..., 0] + half[..., 2]).astype(F32) + (half[..., 1] + half[..., 3]).astype(F32)).astype(F32)
    return y if bsums is None else (y + accm).astype(F32)


def _block_chain_dot(p: quant_dots.IntegerParts, qx: np.ndarray, dx: np.ndarray, sx: np.ndarray | None) -> np.ndarray:
    """Activation rows (Q8_0 q int8 [R, nb, 32], d f32 [R, nb], Q8_1's s f32 [R, nb] or None) against
    Q8_0, Q5_0, Q4_1 or Q5_1 weights (quant_dots.CHAIN_TYPES) in the fast order "block_chain":
    f32 [R, n_out]. Per block the exact integer sum of its 32 products, then
    acc = fma(f32(isum), f32(d_w * d_x), acc); Q4_1 / Q5_1 also accm = fma(m_w, s_x, accm) and give
    f32(acc + accm). The integer sums are exact in float32 (|isum| <= 32 * 128 * 255 < 2^24), so a
    float32 matmul gives them whatever order it adds in."""
    n, nb = p.d.shape
    w = p.weights[:, :, 0, :].transpose(1, 2, 0)  # [nb, 32, n]: contiguous per block as chain_parts keeps it
    xb = qx.astype(F32)
    acc = np.zeros((qx.shape[0], n), F32)
    accm = None if p.m is None else np.zeros_like(acc)
    for b in range(nb):
        isum = xb[:, b] @ w[b]  # [R, n] exact integers
        dd = (dx[:, None, b] * p.d[None, :, b]).astype(F32)
        acc = _fused(isum, dd, acc)
        if accm is not None:  # m_w and s_x are f16 values: their product is exact in f32, so the add is the fma
            accm = (accm + p.m[None, :, b] * sx[:, None, b]).astype(F32)
    return acc if accm is None else (acc + accm).astype(F32)


# Float weights: each type's vec_dot_type is itself (ggml-cpu.c type_traits_cpu), so activations are
# rounded to f16 / bf16 (round half to even) or stay f32, and a decode row goes through
# ggml_vec_dot_{f16,f32,bf16} (vec.cpp) as GCC builds it natively for an AVX-512 machine with
# AVX512-BF16 and without AVX512-FP16 (Zen 4, where the golden data were made). Checked bit for bit
# against those functions of the local native build (ctypes, random rows, K = 1 .. 2048):
# * F16, F32: 64 lanes (simd-mappings.h: GGML_F32_STEP 64, EPR 16), lane l summing elements 64c + l
#   by fma over the chunks c in order; then acc0+acc2, acc1+acc3, their sum, _mm512_reduce_add_ps.
#   F16 adds the K % 64 last elements one by one in float64 (sumf is ggml_float). F32's sumf is a
#   float, and GCC vectorized its leftover loop: the first 16s and then one 8 of the K % 64 last
#   elements as rounded products added in order, the last K % 8 by scalar fmas (the disassembly).
#   That epilogue is GCC's choice, not ggml's source: the same source built natively on a Sapphire
#   Rapids host (GCC's tuning there prefers 256-bit vectors) rounds products up to the last whole 4
#   and fuses only the last K % 4, so F32 weights with K % 8 in 4..7 leftovers differ from such a
#   build in the last bits. The order here stays the Zen 4 build's (every device's kernels follow it).
# * BF16: 2 x 16 lanes over chunks of 64 by _mm512_dpbf16_ps: lane l of vector v takes elements
#   64c + 32v + 2l + 1, then + 2l, each step an fma-like single rounding with bf16 subnormal inputs
#   read as zero and subnormal results flushed to zero (measured on Zen 4); each vector reduced on
#   its own and added in float64; the K % 64 last elements as float32 products added in float64.
FLOAT_CHUNK = 64  # elements per step of the lane accumulators, for every float type
_FLOAT_COLUMNS = 2048  # output columns per step of the float dot (bounds the temporaries)
_F32_TINY = F32(2.0**-126)


def _reduce_add_16(v: np.ndarray) -> np.ndarray:
    """_mm512_reduce_add_ps over the last axis (16 lanes): halves 16 -> 8 -> 4, then (l0+l2)+(l1+l3)."""
    v = (v[..., 8:] + v[..., :8]).astype(F32)
    v = (v[..., 4:] + v[..., :4]).astype(F32)
    return ((v[..., 0] + v[..., 2]).astype(F32) + (v[..., 1] + v[..., 3]).astype(F32)).astype(F32)


def _flush(v: np.ndarray) -> np.ndarray:
    """Subnormal float32 values to zero of the same sign (vdpbf16ps's DAZ on inputs, FTZ on results)."""
    return np.where(np.abs(v) < _F32_TINY, v * F32(0), v).astype(F32)


def _fused(a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """fma_f32(a, b, acc) of float32 operands, faster: the float64 sum of the exact product rounds to
    the fma's float32 unless it fell on a float32 rounding midpoint or below float32's normal range
    (then the float64 rounding may have decided the tie); only then is fma_f32 asked."""
    s = a.astype(np.float64) * b + acc
    r = s.astype(F32)
    suspect = ((s.view(np.uint64) & np.uint64(0x1FFFFFFF)) == np.uint64(0x10000000)) | (np.abs(s) < 2.0**-126)
    if suspect.any():
        a, b, acc = (np.broadcast_to(v, s.shape)[suspect] for v in (a, b, acc))
        r[suspect] = fma_f32(a, b, acc)
    return r


def float_dot(x: np.ndarray, values: np.ndarray, wtype: Q) -> np.ndarray:
    """Activation rows x f32 [R, K] (already rounded to the weight's type) against float weight rows
    values f32 [N, K], in ggml's order (see FLOAT_CHUNK): f32 [R, N]. Rows and columns never mix; the
    lanes run as one array operation per step, elementwise."""
    n_out, k = values.shape
    main = k - k % FLOAT_CHUNK
    xs = x.astype(F32)[:, None, :]  # [R, 1, K]
    w = values[None]  # [1, N, K]
    acc = np.zeros((x.shape[0], n_out, FLOAT_CHUNK // (2 if wtype is Q.BF16 else 1)), F32)
    if wtype is Q.BF16:
        xd, wd = _flush(xs[:, :, :main]), _flush(w[:, :, :main])
    for c in range(0, main, FLOAT_CHUNK):
        if wtype is Q.BF16:  # pairs (2l, 2l+1): the odd element first
            xc, wc = xd[:, :, c : c + 64].reshape(-1, 1, 32, 2), wd[:, :, c : c + 64].reshape(1, -1, 32, 2)
            acc = _flush(_fused(xc[..., 1], wc[..., 1], acc))
            acc = _flush(_fused(xc[..., 0], wc[..., 0], acc))
        elif wtype is Q.F32:
            acc = _fused(xs[:, :, c : c + 64], w[:, :, c : c + 64], acc)
        else:  # a product of two f16 values is exact in f32: one rounding, as the fma's
            acc += xs[:, :, c : c + 64] * w[:, :, c : c + 64]
    if wtype is Q.BF16:
        sums = _reduce_add_16(acc.reshape(*acc.shape[:2], 2, 16))
        sumf = (np.float64(0) + sums[..., 0].astype(np.float64)) + sums[..., 1].astype(np.float64)
    else:
        a = acc.reshape(*acc.shape[:2], 4, 16)
        total = _reduce_add_16((a[..., 0, :] + a[..., 2, :]).astype(F32) + (a[..., 1, :] + a[..., 3, :]).astype(F32))
        if wtype is Q.F32:
            rest = k - main
            unfused = main + rest // 16 * 16 + (8 if rest % 16 >= 8 else 0)
            for i in range(main, k):
                if i < unfused:
                    total = (total + (xs[:, :, i] * w[:, :, i]).astype(F32)).astype(F32)
                else:
                    total = _fused(xs[:, :, i], w[:, :, i], total)
            return total.astype(F32)
        sumf = total.astype(np.float64)
    for i in range(main, k):
        sumf = sumf + (xs[:, :, i] * w[:, :, i]).astype(F32).astype(np.float64)
    return sumf.astype(F32)


def _by_row_chunks(rows: int, n_out: int, dot) -> np.ndarray:
    """f32 [rows, n_out] filled by dot(lo, hi) for each chunk of _LANE_ROWS rows (bounds the temporaries)."""
    out = np.empty((rows, n_out), F32)
    for lo in range(0, rows, _LANE_ROWS):
        hi = min(rows, lo + _LANE_ROWS)
        out[lo:hi] = dot(lo, hi)
    return out


def _superblock_chain(x: np.ndarray, w: DequantizedWeight) -> np.ndarray:
    """x f32 [rows, K] against Q6_K, Q5_K, Q3_K or IQ4_XS weights in "block_chain": one fma per
    super-block of its exact integer dot (Q5_K also its minimum's chain, subtracted at the end)."""
    qx, dx = quantize_q8_k(x)
    if w.type is Q.Q6_K:
        return _by_row_chunks(x.shape[0], w.k_weights.shape[0], lambda lo, hi: _q6k_chain_dot(w, qx[lo:hi], dx[lo:hi]))
    return _by_row_chunks(x.shape[0], w.parts.d.shape[0],
                          lambda lo, hi: _parts_chain(w.parts, qx[lo:hi], dx[lo:hi], "scalar"))


def matmul(x: np.ndarray, w: DequantizedWeight, activations: str = "q8", order: str | None = None) -> np.ndarray:
    """x f32 [rows, K] times w [n_out, K] transposed -> f32 [rows, n_out], in the reduction order
    `order` (kinetic/ir/orders.py; None or ggml's order for the weight type: ggml's semantics).

    Each row is its own matrix-vector product, so a row's result never depends on which other rows
    share the pass (a BLAS matrix-matrix product may block rows differently for different counts).
    Block-32 weights follow ggml's accumulation order exactly (_lane_dot), and so do Q4_K / Q6_K
    (_superblock_dot), Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS, MXFP4 (_parts_dot) and float weights
    (float_dot, ggml_vec_dot_{f16,bf16,f32}); other quantized weights are a float32 product of the
    dequantized operands, which differs from ggml's kernels only in the order of float summation.
    The fast order "block_chain" on Q8_0, Q5_0, Q4_1, Q5_1 weights is _block_chain_dot, on Q6_K, Q5_K,
    Q3_K, IQ4_XS _superblock_chain (on the other types that have it, it is their ggml order); any
    other order the weight type lacks is refused.
    """
    rows = x.shape[0]
    if order is not None and order != weight_order(w.type, activations):
        if order == "block_chain" and activations != "f32" and w.type in quant_dots.SUPERBLOCK_CHAIN_TYPES:
            return _superblock_chain(x, w)
        if order != "block_chain" or activations == "f32" or w.type not in quant_dots.CHAIN_TYPES:
            raise VerifyError(f"the reference has no matmul in order {order!r} for {w.type.name} weights "
                              f"with {activations} activations")
        qx, dx = quantize_q8_0(x)
        sx = q8_1_sums(x) if w.chain_parts.m is not None else None
        return _by_row_chunks(rows, w.chain_parts.d.shape[0], lambda lo, hi: _block_chain_dot(
            w.chain_parts, qx[lo:hi], dx[lo:hi], None if sx is None else sx[lo:hi]))
    if activations != "f32" and w.lanes is not None:
        qx, dx = quantize_q8_0(x)
        sx = q8_1_sums(x) if w.minimums is not None else None
        return _by_row_chunks(rows, w.lanes.shape[1], lambda lo, hi: _lane_dot(
            w, qx[lo:hi], dx[lo:hi], None if sx is None else sx[lo:hi]))
    if activations != "f32" and w.k_weights is not None:
        qx, dx = quantize_q8_k(x)
        return _by_row_chunks(rows, w.k_weights.shape[0], lambda lo, hi: _superblock_dot(w, qx[lo:hi], dx[lo:hi]))
    if activations != "f32" and w.parts is not None:
        qx, dx = (quantize_q8_0 if w.parts.block == 32 else quantize_q8_k)(x)
        return _by_row_chunks(rows, w.parts.d.shape[0], lambda lo, hi: _parts_dot(w.parts, qx[lo:hi], dx[lo:hi]))
    if activations != "f32" and w.type in FLOAT_WEIGHTS:
        xq = quantized_activations(x, activation_format(w.type))
        out = np.empty((x.shape[0], w.values.shape[0]), F32)
        for lo in range(0, x.shape[0], _LANE_ROWS):
            for n0 in range(0, out.shape[1], _FLOAT_COLUMNS):
                n1 = min(out.shape[1], n0 + _FLOAT_COLUMNS)
                out[lo : lo + _LANE_ROWS, n0:n1] = float_dot(xq[lo : lo + _LANE_ROWS], w.values[n0:n1], w.type)
        return out
    out = np.empty((x.shape[0], w.values.shape[0]), F32)
    xq = x.astype(F32) if activations == "f32" else quantized_activations(x, activation_format(w.type))
    for r in range(x.shape[0]):
        out[r] = w.values @ xq[r]
    return out
