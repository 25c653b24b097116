"""Reference numerics shared by the interpreter: activation quantization, matmul, norms, rotary,
activations, attention.

The default semantics is ggml's CPU backend (llama.cpp b1-0c1e570, x86-64 with AVX2/FMA/AVX-512F and
AVX512-BF16, GCC) as it runs one decode row, reproduced bit for bit where docs/numerics.md says so; facts read
from ggml's sources, no code copied. In short:

* A quantized matmul first quantizes each activation row to 8 bits per block: Q8_0 (blocks of 32,
  d = amax/127 stored as f16, q = round-half-even(x * 127/amax)) for Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4
  weights; Q8_1 (Q8_0 plus s = f16(d * sum q)) for Q4_1/Q5_1, whose dot adds min * s per block;
  Q8_K (blocks of 256, iscale = -127/max with max the signed value of largest magnitude, d = 1/iscale
  kept in f32, q = min(127, round-half-even(iscale * x))) for k-quants and i-quants. F16 / BF16
  weights meet f16 / bf16-rounded activations, F32 weights f32 ones.
* Block-32, Q2_K .. Q6_K, IQ4_NL, IQ4_XS and MXFP4 dots follow the float order of the x86 kernels
  llama.cpp runs for a decode row exactly (exact integer lane sums, fma accumulation per block,
  ggml's horizontal sums; quant_dots.py for the newer types), and so do F16 / BF16 / F32 dots
  (ggml_vec_dot_f16 / _bf16 / _f32: 64-lane fma or vdpbf16ps accumulators, float_dot); other types
  are a float32 product of the dequantized operands (same integers, another summation order).
* RMS norm sums squares in float64 and scales in float32.
* Rotary: theta_scale = powf(base, -2/n_rot) and cosf/sinf from the C library, angles advanced by
  float32 products, the rotation fused as fma(x0, cos, -(x1*sin)) / fma(x0, sin, x1*cos).
* SiLU uses ggml's vectorized exp (ggml_v_expf); GELU is ggml's f16 table built with tanhf, with
  x <= -10 -> 0 and x >= 10 -> x.
* Attention is ggml's CPU flash attention for one query row: q rounded to the cache type,
  ggml_vec_dot_f16's order for scores, keys in cache order with an online softmax using the C
  library's expf, an f16 value accumulator rounded after every key, S = fma(S, ms, vs), out = acc/S
  computed as acc * (1/S).

A row's result never depends on the other rows of the pass. The float path (activations="f32")
keeps plain float32 matmuls of dequantized weights.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants as gguf_quants

from kinetic.ir import quant_dots
from kinetic.ir.quants import dequantize

F32 = np.float32


def _load_libm():
    """The C library's float functions (ggml calls tanhf, cosf, sinf, powf; numpy's own float32
    versions differ from them in the last bit often enough to matter). None where unavailable."""
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        for name in ("tanhf", "cosf", "sinf", "expf"):
            getattr(lib, name).restype = ctypes.c_float
            getattr(lib, name).argtypes = [ctypes.c_float]
        lib.powf.restype = ctypes.c_float
        lib.powf.argtypes = [ctypes.c_float, ctypes.c_float]
        return lib
    except (OSError, AttributeError):
        return None


_LIBM = _load_libm()


def libm_f32(name: str, x: np.ndarray) -> np.ndarray:
    """Apply the C library's float function `name` (tanhf, cosf, sinf) elementwise; numpy's float32
    function where the C library cannot be loaded."""
    x = np.asarray(x, F32)
    if _LIBM is None:
        return {"tanhf": np.tanh, "cosf": np.cos, "sinf": np.sin, "expf": np.exp}[name](x).astype(F32)
    fn = getattr(_LIBM, name)
    return np.fromiter((fn(float(v)) for v in x.reshape(-1)), F32, x.size).reshape(x.shape)


def powf(base: float, exponent: float) -> np.float32:
    if _LIBM is None:
        return F32(np.power(np.float64(F32(base)), np.float64(F32(exponent))))
    return F32(_LIBM.powf(float(F32(base)), float(F32(exponent))))


def fma_f32(a, b, c) -> np.ndarray:
    """A true fused multiply-add of float32 operands: a*b + c rounded once to float32, as the
    hardware's fma (and ggml's compiled code) gives it. a*b is exact in float64; the float64 sum s
    is corrected by its exact error e (TwoSum), which matters only when s lies exactly halfway
    between two float32 values: then the true sum is on e's side of that midpoint."""
    p = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    c64 = np.asarray(c, np.float64)
    with np.errstate(all="ignore"):
        s = p + c64
        bb = s - p
        e = (p - (s - bb)) + (c64 - bb)
        r = s.astype(F32)
        d = s - r.astype(np.float64)
        toward = np.nextafter(r, np.where(d > 0, F32(np.inf), F32(-np.inf)).astype(F32))
        tie = (d != 0) & (np.abs(d) * 2 == np.abs(toward.astype(np.float64) - r.astype(np.float64)))
        fix = tie & (e != 0) & ((e > 0) == (d > 0))
    return np.where(fix, toward, r).astype(F32)

Q8_0_USERS = {Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.IQ4_NL, Q.MXFP4}
Q8_1_USERS = {Q.Q4_1, Q.Q5_1}
FLOAT_WEIGHTS = {Q.F32, Q.F16, Q.BF16}


def activation_format(wtype: Q) -> str:
    """The 8-bit format activations take before a dot with weights of type `wtype`."""
    if wtype in FLOAT_WEIGHTS:
        return wtype.name.lower()
    if wtype in Q8_0_USERS:
        return "q8_0"
    if wtype in Q8_1_USERS:
        return "q8_1"
    return "q8_k"


def quantize_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f32 [rows, K] -> (q int8 [rows, K/32, 32], d f32 [rows, K/32] holding the f16-rounded scale)."""
    rows, k = x.shape
    xb = x.reshape(rows, k // 32, 32).astype(np.float32)
    amax = np.abs(xb).max(axis=2)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[:, :, None]).astype(np.int8)
    return q, d.astype(np.float16).astype(np.float32)


def quantize_q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f32 [rows, K] -> (q int8 [rows, K/256, 256], d f32 [rows, K/256])."""
    rows, k = x.shape
    xb = x.reshape(rows, k // 256, 256).astype(np.float32)
    idx = np.abs(xb).argmax(axis=2)
    signed_max = np.take_along_axis(xb, idx[:, :, None], axis=2)[:, :, 0]
    nonzero = signed_max != 0
    with np.errstate(divide="ignore"):
        iscale = np.where(nonzero, np.float32(-127) / signed_max, np.float32(0)).astype(np.float32)
    q = np.minimum(np.rint(xb * iscale[:, :, None]), 127).astype(np.int8)
    with np.errstate(divide="ignore"):
        d = np.where(nonzero, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    return q, d


def quantized_activations(x: np.ndarray, fmt: str) -> np.ndarray:
    """The activation values a dot with weights of this format actually sees (f32 [rows, K])."""
    if fmt == "f32":
        return x.astype(np.float32)
    if fmt == "f16":
        with np.errstate(over="ignore"):  # beyond f16's range: inf, as vcvtps2ph gives
            return x.astype(np.float16).astype(np.float32)
    if fmt == "bf16":  # ggml_compute_fp32_to_bf16: round half to even, a NaN kept quiet
        bits = x.astype(np.float32).view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        rounded = np.where(np.isnan(x), (bits & 0xFFFF0000) | 0x400000, rounded).astype(np.uint32)
        return rounded.view(np.float32)
    if fmt in ("q8_0", "q8_1"):
        q, d = quantize_q8_0(x)
    else:
        q, d = quantize_q8_k(x)
    return (q.astype(np.float32) * d[:, :, None]).reshape(x.shape)


def q8_1_sums(x: np.ndarray) -> np.ndarray:
    """Q8_1's per-block s = f16(d * sum q) with d unrounded: f32 [rows, K/32]."""
    rows, k = x.shape
    xb = x.reshape(rows, k // 32, 32).astype(np.float32)
    amax = np.abs(xb).max(axis=2)
    d = (amax / np.float32(127)).astype(np.float32)
    q, _ = quantize_q8_0(x)
    s = d * q.astype(np.int32).sum(axis=2).astype(np.float32)
    return s.astype(np.float16).astype(np.float32)


def block_minimums(raw: np.ndarray, wtype: Q) -> np.ndarray:
    """The per-block minimum m of Q4_1/Q5_1 weights [n_out, row_bytes] -> f32 [n_out, K/32]."""
    block_bytes = {Q.Q4_1: 20, Q.Q5_1: 24}[wtype]
    blocks = raw.reshape(raw.shape[0], -1, block_bytes)
    return blocks[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32)


# Block-32 weight types whose ggml dot product (arch/x86/quants.c ggml_vec_dot_{q4_0,q4_1,q5_0,q5_1,
# q8_0}_q8_{0,1}, llamafile/sgemm.cpp tinyBLAS_Q0_AVX) has one shape: per block, the exact integer
# dot of 32 values in 8 lanes of 4 consecutive values, each lane accumulated in float32 by
# fma(d_w*d_x, lane, acc) over the blocks in order, then the 8 lanes summed as
# ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)); Q4_1/Q5_1 add the sum over blocks of m_w*s_x. (IQ4_NL is
# repacked on x86 and follows its gemv instead: quant_dots.SCALAR_ORDER.)
LANE_TYPES = {Q.Q5_0, Q.Q8_0, Q.Q4_1, Q.Q5_1}
_LANE_ROWS = 16  # activation rows per step of the lane-ordered dot


class DequantizedWeight:
    """A weight held dequantized once (f32 [n_out, K]) plus what its matmul needs. Block-32 weights
    hold their integer quants as float32 (`lanes`) and their f16 block scales instead; their
    dequantized `values` are computed only if asked for (the float path)."""

    def __init__(self, raw: np.ndarray, wtype: Q):
        self.type = wtype
        self._raw = raw
        self._values = None
        self.minimums = block_minimums(raw, wtype) if wtype in Q8_1_USERS else None
        self.lanes = None
        self.k_weights = None
        self.parts = None  # quant_dots.IntegerParts of Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS, MXFP4
        if wtype in LANE_TYPES:
            values = dequantize(raw, wtype).reshape(raw.shape[0], -1)
            n_out, k = values.shape
            # the f16 block scale leads every block-32 layout
            blocks = raw.reshape(n_out, k // 32, -1)
            self.scales = blocks[:, :, 0:2].copy().view(np.float16)[:, :, 0].astype(F32)
            if self.minimums is not None:
                values -= np.repeat(self.minimums, 32, axis=1)
            with np.errstate(divide="ignore", invalid="ignore"):
                q = values.reshape(n_out, k // 32, 32) / self.scales[:, :, None]
            # the integer weight of each value (values are d*q (+ m) of small integers q)
            q = np.rint(np.nan_to_num(q, posinf=0, neginf=0)).astype(F32)
            # laid out [K/4 lane groups, n_out, 4] so that every lane sum is one batched product
            self.lanes = np.ascontiguousarray(q.reshape(n_out, k // 4, 4).transpose(1, 0, 2))
        elif wtype in (Q.Q4_K, Q.Q6_K):
            self._superblock_parts(raw, wtype)
        elif wtype in quant_dots.TYPES:
            self.parts = quant_dots.integer_parts(raw.reshape(raw.shape[0], -1), wtype)
        else:
            self._values = dequantize(raw, wtype).reshape(raw.shape[0], -1)

    def _superblock_parts(self, raw: np.ndarray, wtype: Q) -> None:
        """Integer parts of Q4_K / Q6_K rows (block layouts of ggml-common.h, decoded as gguf does),
        as float64 matrices whose products with Q8_K quants are exact integers."""
        n_out = raw.shape[0]
        blocks = raw.reshape(-1, {Q.Q4_K: 144, Q.Q6_K: 210}[wtype])
        nsb = blocks.shape[0] // n_out
        if wtype is Q.Q4_K:
            d = blocks[:, 0:2].copy().view(np.float16)[:, 0].astype(F32)
            dmin = blocks[:, 2:4].copy().view(np.float16)[:, 0].astype(F32)
            sc, mn = gguf_quants.Q4_K.get_scale_min(blocks[:, 4:16].copy())
            qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
            q = (qs & np.uint8(15)).reshape(-1, 8, 32).astype(np.float64)
            # iacc = sum sc*q*qx over the super-block; imin = sum m * (sum of 32 qx)
            self.k_weights = (q * sc[:, :, None]).reshape(n_out, nsb, 256)
            self.k_mins = mn.astype(np.float64).reshape(n_out, nsb, 8)
            self.k_d, self.k_dmin = d.reshape(n_out, nsb), dmin.reshape(n_out, nsb)
        else:
            ql = blocks[:, 0:128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
            ql = (ql & np.uint8(15)).reshape(-1, 2, 128)
            qh = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
            qh = (qh & np.uint8(3)).reshape(-1, 2, 128)
            qu = (ql | (qh << np.uint8(4))).reshape(-1, 256).astype(np.float64)  # 0..63, offset 32 not applied
            sc = blocks[:, 192:208].copy().view(np.int8).astype(np.float64)  # one per 16 values
            sc_e = np.repeat(sc, 16, axis=1)
            # ggml_vec_dot_q6_K_q8_K: lane l sums, over the 8 chunks c of 32, values 32c+4l..32c+4l+3 of
            # sc*qu*qx, minus 32 * sum of sc*qx over values 32l..32l+31 (the -32 offset through bsums)
            lane_perm = np.array([32 * c + 4 * l + i for l in range(8) for c in range(8) for i in range(4)])
            self.k_weights = (sc_e * qu)[:, lane_perm].reshape(n_out, nsb, 256)
            self.k_offsets = (32 * sc_e).reshape(n_out, nsb, 256)
            self.k_perm = lane_perm
            self.k_d = blocks[:, 208:210].copy().view(np.float16)[:, 0].astype(F32).reshape(n_out, nsb)

    @property
    def values(self) -> np.ndarray:
        if self._values is None:
            self._values = dequantize(self._raw, self.type).reshape(self._raw.shape[0], -1)
        return self._values


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


def _parts_dot(p: quant_dots.IntegerParts, qx: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """Activation rows (q int8 [R, nb, block], d f32 [R, nb]) against Q2_K, Q3_K, Q5_K, IQ4_NL,
    IQ4_XS or MXFP4 weights in the float order of ggml's x86 kernels (quant_dots): f32 [R, n_out].
    Per block: the exact integer lanes (one float64 product per lane) converted to f32, then
    acc = fma(f32(ints), d_x*d_w, acc). "lanes" (vec_dot): hsum_float_8(acc), Q5_K plus
    summs = fma(-(d_x*dmin_w), f32(imin), summs) (GCC contracts `summs += dmin * isum`).
    "scalar" (repacked gemv): acc, Q2_K minus accmin = fma(f32(imin), dmin_w*d_x, accmin).
    imin = sum_j min_j * (Q8_K sum of 16 j), exact."""
    n, nb, lanes, pos = p.weights.shape
    rows = qx.shape[0]
    xb = qx.reshape(rows, nb, p.block)[:, :, p.perm].reshape(rows, nb, lanes, pos)
    xb = xb.astype(np.float64).transpose(1, 2, 0, 3)  # [nb, lanes, R, pos]
    acc = np.zeros((rows, n, lanes), F32)
    accm = np.zeros((rows, n), F32)
    bsums = qx.reshape(rows, nb, -1, 16).astype(np.float64).sum(axis=3) if p.mins is not None else None
    for b in range(nb):
        wb = p.weights[:, b].astype(np.float64).transpose(1, 2, 0)  # [lanes, pos, n]
        ints = np.matmul(xb[b], wb).transpose(1, 2, 0).astype(F32)  # [R, n, lanes]: exact, then cvtdq2ps
        dd = (dx[:, None, b] * p.d[None, :, b]).astype(F32)
        acc = fma_f32(ints, dd[..., None], acc)
        if bsums is not None:
            imin = (bsums[:, b] @ p.mins[:, b].astype(np.float64).T).astype(F32)
            dm = (dx[:, None, b] * p.dmin[None, :, b]).astype(F32)
            accm = fma_f32(imin, dm, accm) if p.order == "scalar" else fma_f32(-dm, imin, accm)
    if p.order == "scalar":
        return acc[..., 0] if bsums is None else (acc[..., 0] - accm).astype(F32)
    half = (acc[..., 4:] + acc[..., :4]).astype(F32)
    y = ((half[..., 0] + half[..., 2]).astype(F32) + (half[..., 1] + half[..., 3]).astype(F32)).astype(F32)
    return y if bsums is None else (y + accm).astype(F32)


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


def matmul(x: np.ndarray, w: DequantizedWeight, activations: str = "q8") -> np.ndarray:
    """x f32 [rows, K] times w [n_out, K] transposed -> f32 [rows, n_out], with ggml's semantics.

    Each row is its own matrix-vector product, so a row's result never depends on which other rows
    share the pass (a BLAS matrix-matrix product may block rows differently for different counts).
    Block-32 weights follow ggml's accumulation order exactly (_lane_dot), and so do Q4_K / Q6_K
    (_superblock_dot), Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS, MXFP4 (_parts_dot) and float weights
    (float_dot, ggml_vec_dot_{f16,bf16,f32}); other quantized weights are a float32 product of the
    dequantized operands, which differs from ggml's kernels only in the order of float summation.
    """
    if activations != "f32" and w.lanes is not None:
        qx, dx = quantize_q8_0(x)
        sx = q8_1_sums(x) if w.minimums is not None else None
        out = np.empty((x.shape[0], w.lanes.shape[1]), F32)
        for lo in range(0, x.shape[0], _LANE_ROWS):  # bounds the temporaries
            hi = min(x.shape[0], lo + _LANE_ROWS)
            out[lo:hi] = _lane_dot(w, qx[lo:hi], dx[lo:hi], None if sx is None else sx[lo:hi])
        return out
    if activations != "f32" and w.k_weights is not None:
        qx, dx = quantize_q8_k(x)
        out = np.empty((x.shape[0], w.k_weights.shape[0]), F32)
        for lo in range(0, x.shape[0], _LANE_ROWS):
            hi = min(x.shape[0], lo + _LANE_ROWS)
            out[lo:hi] = _superblock_dot(w, qx[lo:hi], dx[lo:hi])
        return out
    if activations != "f32" and w.parts is not None:
        qx, dx = (quantize_q8_0 if w.parts.block == 32 else quantize_q8_k)(x)
        out = np.empty((x.shape[0], w.parts.d.shape[0]), F32)
        for lo in range(0, x.shape[0], _LANE_ROWS):
            hi = min(x.shape[0], lo + _LANE_ROWS)
            out[lo:hi] = _parts_dot(w.parts, qx[lo:hi], dx[lo:hi])
        return out
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


def rms_norm(x: np.ndarray, eps: float, group: int = 0) -> np.ndarray:
    rows, width = x.shape
    g = group or width
    xg = x.reshape(rows, width // g, g).astype(np.float32)
    mean = (np.square(xg).astype(np.float64).sum(axis=2) / g).astype(np.float32)
    scale = (np.float32(1) / np.sqrt(mean + np.float32(eps))).astype(np.float32)
    return (xg * scale[:, :, None]).reshape(rows, width)


_ROPE_CACHE: dict[tuple, dict[int, tuple[np.ndarray, np.ndarray]]] = {}


def rope_angles(positions: np.ndarray, n_rot: int, theta: float, freq_scale: float) -> np.ndarray:
    """f32 [rows, n_rot/2] angles as ggml's rope cache builds them (ops.cpp, ggml_rope_cache_init):
    theta_scale = powf(base, -2/n_rot) from the C library, the angle starts at the position (f32)
    and is multiplied by theta_scale in float32 for each pair, then by freq_scale."""
    step = powf(theta, F32(-2.0) / F32(n_rot))
    out = np.empty((len(positions), n_rot // 2), F32)
    cur = np.asarray(positions).astype(F32)
    for i in range(n_rot // 2):
        out[:, i] = F32(freq_scale) * cur
        cur = (cur * step).astype(F32)
    return out


def rope_cos_sin(positions: np.ndarray, n_rot: int, theta: float, freq_scale: float,
                 mscale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin f32 [rows, n_rot/2] of the rope angles, by the C library's cosf/sinf (ggml's
    rope_yarn without the YaRN ramp), times mscale; cached per position."""
    cache = _ROPE_CACHE.setdefault((float(theta), int(n_rot), float(freq_scale), float(mscale)), {})
    missing = sorted({int(p) for p in positions} - cache.keys())
    if missing:
        ang = rope_angles(np.array(missing), n_rot, theta, freq_scale)
        cos = (libm_f32("cosf", ang) * F32(mscale)).astype(F32)
        sin = (libm_f32("sinf", ang) * F32(mscale)).astype(F32)
        for i, p in enumerate(missing):
            cache[p] = (cos[i], sin[i])
    cos = np.stack([cache[int(p)][0] for p in positions]) if len(positions) else np.zeros((0, n_rot // 2), F32)
    sin = np.stack([cache[int(p)][1] for p in positions]) if len(positions) else np.zeros((0, n_rot // 2), F32)
    return cos, sin


def rope_rotate(x0: np.ndarray, x1: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One rotary pair as ggml's rotate_pairs computes it once the compiler has contracted it
    (GCC, -march with FMA): y0 = fma(x0, cos, -(x1*sin)), y1 = fma(x0, sin, x1*cos)."""
    y0 = fma_f32(x0, cos, -(x1 * sin).astype(F32))
    y1 = fma_f32(x0, sin, (x1 * cos).astype(F32))
    return y0, y1


_GELU_TABLE: list[np.ndarray] = []

SQRT_2_OVER_PI = F32(0.79788456080286535587989211986876)
GELU_COEF_A = F32(0.044715)


def gelu_table() -> np.ndarray:
    """ggml's GELU table (ggml-cpu.c, ggml_cpu_init; vec.h, ggml_gelu_f32): for every f16 value x,
    f16(0.5x * (1 + tanhf(S x * (1 + A x x)))) in float32 with the C library's tanhf, where the
    compiler contracts 1 + (A x) x into one fma. Indexed by the f16 bit pattern."""
    if not _GELU_TABLE:
        x = np.arange(65536, dtype=np.uint16).view(np.float16).astype(F32)
        with np.errstate(all="ignore"):
            inner = ((SQRT_2_OVER_PI * x) * fma_f32(GELU_COEF_A * x, x, F32(1))).astype(F32)
            t = libm_f32("tanhf", np.nan_to_num(inner))
            y = ((F32(0.5) * x) * (F32(1) + t)).astype(np.float16)
        _GELU_TABLE.append(y)
    return _GELU_TABLE[0]


def gelu_ggml(x: np.ndarray) -> np.ndarray:
    """GELU (tanh form) as ggml's CPU evaluates it (vec.h, ggml_vec_gelu_f32 / ggml_vec_geglu_f32 with
    GGML_GELU_FP16): x <= -10 -> 0, x >= 10 -> x, otherwise the table entry of f16(x)."""
    x = np.asarray(x, F32)
    y = gelu_table()[x.astype(np.float16).view(np.uint16)].astype(F32)
    y = np.where(x <= -10, F32(0), y)
    return np.where(x >= 10, x, y).astype(F32)


def expf_ggml(x: np.ndarray) -> np.ndarray:
    """ggml_v_expf, the vectorized exp of ggml's SiLU (vec.h, AVX-512 variant): a degree-5
    polynomial on the reduced argument with fmas, scaled by 2^n; |n| > 192 saturates to 0 or inf."""
    x = np.asarray(x, F32)
    with np.errstate(all="ignore"):
        r = F32(float.fromhex("0x1.8p23"))
        z = fma_f32(x, F32(float.fromhex("0x1.715476p+0")), r)
        n = (z - r).astype(F32)
        b = fma_f32(-n, F32(float.fromhex("0x1.7f7d1cp-20")), fma_f32(-n, F32(float.fromhex("0x1.62e4p-1")), x))
        u = (b * b).astype(F32)
        c5, c4 = F32(float.fromhex("0x1.0e4020p-7")), F32(float.fromhex("0x1.573e2ep-5"))
        c3, c2 = F32(float.fromhex("0x1.555e66p-3")), F32(float.fromhex("0x1.fffdb6p-2"))
        c1 = F32(float.fromhex("0x1.ffffecp-1"))
        j = fma_f32(fma_f32(fma_f32(c5, b, c4), u, fma_f32(c3, b, c2)), u, fma_f32(c1, b, F32(1)))
        res = np.ldexp(j, np.clip(n, -300, 300).astype(np.int32)).astype(F32)
        big = np.abs(n) > 192
        return np.where(big, np.where(n <= 0, F32(0), F32(np.inf)), res).astype(F32)


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanhf(x * (1/cap)): ggml's scale, tanh (C library tanhf), scale sequence."""
    inv = (F32(1) / F32(cap)).astype(F32)
    return (F32(cap) * libm_f32("tanhf", (np.asarray(x, F32) * inv).astype(F32))).astype(F32)


def silu(x: np.ndarray) -> np.ndarray:
    """x / (1 + ggml_v_expf(-x)) in float32 (vec.h, ggml_v_silu)."""
    x = np.asarray(x, F32)
    with np.errstate(all="ignore"):
        return (x / (F32(1) + expf_ggml((F32(0) - x).astype(F32)))).astype(F32)


def dot_f16(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f16 (vec.cpp) on x86 with AVX-512F and no native f16 arithmetic: f16 operands
    widened to f32, 4 accumulators of 16 lanes fed by fma over chunks of 64 values, then
    acc0+acc2, acc1+acc3, their sum, and _mm512_reduce_add_ps (halves 16 -> 8 -> 4, then
    (l0+l2)+(l1+l3)); values past the last full chunk of 64 are added one by one in float64, and the
    result is rounded to f32. q [..., hd] and k [..., hd] f32 holding f16 values, broadcast; f32 [...].
    Each product of two f16 values is exact in f32, so the fma is exact in float64 then rounded."""
    hd = q.shape[-1]
    main = hd - hd % 64
    shape = np.broadcast_shapes(q.shape, k.shape)[:-1]
    acc = np.zeros(shape + (4, 16), np.float64)
    for c in range(0, main, 64):
        prod = q[..., c : c + 64].astype(np.float64) * k[..., c : c + 64].astype(np.float64)
        acc = (prod.reshape(shape + (4, 16)) + acc).astype(F32).astype(np.float64)
    a = acc.astype(F32)
    v = ((a[..., 0, :] + a[..., 2, :]).astype(F32) + (a[..., 1, :] + a[..., 3, :]).astype(F32)).astype(F32)
    v = (v[..., 8:] + v[..., :8]).astype(F32)
    v = (v[..., 4:] + v[..., :4]).astype(F32)
    total = ((v[..., 0] + v[..., 2]).astype(F32) + (v[..., 1] + v[..., 3]).astype(F32)).astype(F32)
    if main == hd:
        return total
    sumf = total.astype(np.float64)
    for i in range(main, hd):
        sumf = sumf + (q[..., i].astype(np.float64) * k[..., i].astype(np.float64))
    return sumf.astype(F32)


def attention_online(q: np.ndarray, keys: np.ndarray, vals: np.ndarray, visible: np.ndarray, a) -> np.ndarray:
    """q f32 [rows, n_head*hd], keys/vals [n, n_kv*hd] in the cache dtype, visible bool [rows, n].

    ggml's CPU flash attention for one query row (ops.cpp, ggml_compute_forward_flash_attn_ext_f16_one_chunk):
    q rounded to the cache type; per visible key in cache order the score s = dot_f16(q, k) * scale
    (then softcap), and an online softmax: on a new maximum M the accumulator is scaled by
    ms = expf(M_old - M), else vs = expf(s - M); the accumulator += v * vs (for an f16 cache an f16
    accumulator, each step an f32 fma rounded to f16); S = fma(S, ms, vs); out = acc * (1/S).
    expf is the C library's. Every row is computed on its own.
    """
    rows = q.shape[0]
    nh, nkv, hd = a.n_head, a.n_kv_head, a.head_dim
    group = nh // nkv
    f16 = keys.dtype == np.float16
    qh = q.astype(keys.dtype).astype(F32).reshape(rows, nkv, group, 1, hd)
    kh = keys.astype(F32).reshape(-1, nkv, hd)
    vh = vals.astype(F32).reshape(-1, nkv, hd)
    # scores f32 [rows, nkv, group, n]
    kt = kh.transpose(1, 0, 2)[:, None, :, :]  # [nkv, 1, n, hd]
    scores = np.empty((rows, nkv, group, kh.shape[0]), F32)
    for r in range(rows):
        scores[r] = dot_f16(qh[r], kt) if f16 else (qh[r].astype(np.float64) * kt).sum(-1).astype(F32)
    if a.softcap:  # ggml folds 1/softcap into the scale: s = softcap * tanhf(dot * (scale/softcap))
        scores = (scores * (F32(a.scale) / F32(a.softcap)).astype(F32)).astype(F32)
        scores = (F32(a.softcap) * libm_f32("tanhf", scores)).astype(F32)
    else:
        scores = (scores * F32(a.scale)).astype(F32)
    acc = np.zeros((rows, nkv, group, hd), np.float16 if f16 else F32)
    m = np.full((rows, nkv, group), -np.inf, F32)
    s_sum = np.zeros((rows, nkv, group), F32)
    for j in range(kh.shape[0]):
        live = visible[:, j][:, None, None]
        if not live.any():
            continue
        s = scores[:, :, :, j]
        new_max = (s > m) & live
        with np.errstate(invalid="ignore", over="ignore"):
            arg = np.where(new_max, m - s, s - m).astype(F32)
            e = libm_f32("expf", np.where(live, arg, F32(0)))
        ms = np.where(new_max, e, F32(1)).astype(F32)
        vs = np.where(new_max, F32(1), e).astype(F32)
        vs = np.where(live, vs, F32(0)).astype(F32)
        m = np.where(new_max, s, m)
        # a new maximum rescales the accumulator, which is stored (rounded) before the add
        scaled = (acc.astype(np.float64) * ms[..., None]).astype(F32).astype(acc.dtype)
        summed = fma_f32(vh[j][None, :, None, :], vs[..., None], scaled.astype(F32))
        acc = np.where(live[..., None], summed.astype(acc.dtype), acc)
        s_sum = np.where(live, fma_f32(s_sum, ms, vs), s_sum)
    with np.errstate(divide="ignore"):
        inv = np.where(s_sum == 0, F32(0), F32(1) / s_sum).astype(F32)
    out = (acc.astype(F32) * inv[..., None]).astype(F32)
    return out.reshape(rows, nh * hd)
