"""The compiled step's kernels for recurrent ops (numba): one row of Gated DeltaNet's delta rule and of
Mamba-2's selective scan, every head; the short convolution's taps for every row of a pass; sigmoid.

Owns `delta_rule_row`: numerics.delta_rule_row's arithmetic (kinetic/ir/numerics/recurrent.py) as
machine code, bit for bit: the decayed state (one f32 rounding a value), each value row's dot with k
and with q as ggml_vec_dot_f32 runs on the AVX-512 build (4 x 16 fma lanes over chunks of 64, the
lanes reduced as ggml reduces them, then the tail: 16s and an 8 as rounded products added, the last
fewer than 8 one fma each), the rank-one update as one fma a value. `ssm_scan_row`:
numerics.ssm_scan_row's, each state value fma(s, dA, B * x_dt) and y its dot with C in the same
lanes, the states past the last whole chunk one fma each onto the sum. `short_conv_rows`:
numerics.short_conv_row's tap order for each row's gathered window. `sigmoid`: 1 / (1 + expf(-x))
calling the C library's expf (the one the reference's numerics call) from compiled code. The fma is LLVM's llvm.fma.f32
(a true fused multiply-add on every target); numba compiles without fast-math, so no other
operation is contracted or reordered. Per-head scalars (expf of the gate, the sigmoid, softplus and
the scan's decay) come in computed by the reference's numerics (the C library's expf and logf), so no
libm call is compiled here.
A row reads only its own state and inputs: a batch gives each row what it gets alone. Does not own
which state a row continues (kinetic/ir/recurrence.py's walk) nor the ops' meaning.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from kinetic.ir.numerics import recurrent as reference
from kinetic.ir.numerics.floats import _LIBM, libm_f32
from kinetic.ir.numerics.recurrent import softplus

LANES = 64  # GGML_F32_STEP on AVX-512: 4 vectors of 16


@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c rounded once (llvm.fma.f32)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32, f32, f32]))
        return builder.call(fn, args)

    return sig, codegen


@njit(cache=True)
def _fold_lanes(lanes, v):  # pragma: no cover - compiled
    """The 64 lanes' sums reduced as ggml reduces its four 16-wide vectors: (0 + 2) + (1 + 3) per lane,
    then halves 8 and 4 folded, then (v0 + v2) + (v1 + v3); `v`: 16 floats of scratch."""
    for i in range(16):
        v[i] = (lanes[i] + lanes[32 + i]) + (lanes[16 + i] + lanes[48 + i])
    for half in (8, 4):
        for i in range(half):
            v[i] = v[i + half] + v[i]
    return (v[0] + v[2]) + (v[1] + v[3])


@njit(cache=True)
def _vec_dot(x, y):  # pragma: no cover - compiled
    """ggml_vec_dot_f32 of two f32 vectors (see the module docstring)."""
    n = x.shape[0]
    main = n - n % LANES
    lanes = np.zeros(LANES, np.float32)
    for start in range(0, main, LANES):
        for i in range(LANES):
            lanes[i] = _fma(x[start + i], y[start + i], lanes[i])
    total = _fold_lanes(lanes, np.empty(16, np.float32))
    rest = n - main
    unfused = main + rest // 16 * 16 + (8 if rest % 16 >= 8 else 0)
    for i in range(main, n):
        if i < unfused:
            total = total + x[i] * y[i]
        else:
            total = _fma(x[i], y[i], total)
    return total


@njit(cache=True)
def _rows(state, q, k, v, decay, beta, scale, out):  # pragma: no cover - compiled
    n_head, size = state.shape[0], state.shape[1]
    delta = np.empty(size, np.float32)
    for h in range(n_head):
        m = state[h]
        for j in range(size):
            for i in range(size):
                m[j, i] = m[j, i] * decay[h]
        for j in range(size):
            delta[j] = (v[h, j] - _vec_dot(m[j], k[h])) * beta[h]
        for j in range(size):
            for i in range(size):
                m[j, i] = _fma(k[h, i], delta[j], m[j, i])
        for j in range(size):
            out[h, j] = _vec_dot(m[j], q[h]) * scale


def delta_rule_row(state: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, decay: np.ndarray,
                   beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numerics.delta_rule_row with expf(gate) given as `decay`: state f32 [n_head, S, S] (left as it
    is), q, k, v f32 [n_head, S], decay and beta f32 [n_head]. Returns out f32 [n_head, S] and the new
    state."""
    new = np.array(state, np.float32, copy=True, order="C")
    out = np.empty(v.shape, np.float32)
    scale = np.float32(1) / np.float32(np.sqrt(np.float32(state.shape[-1])))
    f = [np.ascontiguousarray(t, np.float32) for t in (q, k, v, decay, beta)]
    _rows(new, *f, scale, out)
    return out, new


@njit(cache=True)
def _scan(state, x_dt, decay, b, c, y):  # pragma: no cover - compiled
    n_head, head_dim, d_state = state.shape
    main = d_state - d_state % LANES
    lanes = np.empty(LANES, np.float32)
    v = np.empty(16, np.float32)
    for h in range(n_head):
        for i in range(head_dim):
            s = state[h, i]
            lanes[:] = 0
            for start in range(0, main, LANES):
                for lane in range(LANES):
                    s[start + lane] = _fma(s[start + lane], decay[h], b[h, start + lane] * x_dt[h, i])
                    lanes[lane] = _fma(s[start + lane], c[h, start + lane], lanes[lane])
            total = _fold_lanes(lanes, v)
            for k in range(main, d_state):
                s[k] = _fma(s[k], decay[h], b[h, k] * x_dt[h, i])
                total = _fma(s[k], c[h, k], total)
            y[h, i] = total


def ssm_scan_row(state: np.ndarray, x: np.ndarray, dt: np.ndarray, a: np.ndarray, b: np.ndarray,
                 c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numerics.ssm_scan_row, the same arguments and bits: state f32 [n_head, head_dim, d_state] (left
    as it is), x f32 [n_head, head_dim], dt and a f32 [n_head], b and c f32 [n_head, d_state]."""
    sp = softplus(dt)
    decay = libm_f32("expf", (sp * a).astype(np.float32))
    x_dt = (x * sp[:, None]).astype(np.float32)
    new = np.array(state, np.float32, copy=True, order="C")
    y = np.empty(x.shape, np.float32)
    _scan(new, x_dt, decay, np.ascontiguousarray(b, np.float32), np.ascontiguousarray(c, np.float32), y)
    return y, new


@njit(cache=True)
def _conv(windows, kernel, out):  # pragma: no cover - compiled
    n, taps, channels = windows.shape
    for r in range(n):
        for c in range(channels):
            acc = np.float32(0)
            tap = 0
            while taps - tap >= 16:
                for t in range(tap, tap + 16):
                    acc = acc + windows[r, t, c] * kernel[c, t]
                tap += 16
            if taps - tap >= 8:
                for t in range(tap, tap + 8):
                    acc = acc + windows[r, t, c] * kernel[c, t]
                tap += 8
            for t in range(tap, taps):
                acc = _fma(windows[r, t, c], kernel[c, t], acc)
            out[r, c] = acc


def short_conv_rows(windows: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """numerics.short_conv_row of each row: windows f32 [T, taps, C] (oldest first), kernel f32 [C, taps];
    returns f32 [T, C]."""
    out = np.empty((windows.shape[0], windows.shape[2]), np.float32)
    _conv(np.ascontiguousarray(windows, np.float32), np.ascontiguousarray(kernel, np.float32), out)
    return out


if _LIBM is not None:
    _expf = _LIBM.expf

    @njit(cache=False)
    def _sigmoid(x, out):  # pragma: no cover - compiled
        flat, dst = x.reshape(-1), out.reshape(-1)
        for i in range(flat.shape[0]):
            dst[i] = np.float32(1) / (np.float32(1) + np.float32(_expf(np.float32(0) - flat[i])))

    def sigmoid(x: np.ndarray) -> np.ndarray:
        """numerics.recurrent.sigmoid's bits: f32 in, f32 out, the C library's expf."""
        x = np.ascontiguousarray(x, np.float32)
        out = np.empty_like(x)
        _sigmoid(x, out)
        return out
else:
    sigmoid = reference.sigmoid  # no C library to call: the reference's fallback
