"""The arithmetic of recurrent layers for one row: what a layer computes from the state its row
continues and the row's input, and the state it leaves.

Owns: `short_conv_row` (ggml_ssm_conv as lfm2 and Mamba-2's conv use it: each channel's dot of its
kernel with the last `kernel` values of that channel, in ascending tap order from 0) and
`ssm_scan_row` (ggml_ssm_scan for Mamba-2: the state update and its dot with C), with `softplus`.
Does not own which state a row continues (kinetic/ir/recurrence.py walks the pass's rows), nor
keeping states between passes (kinetic/runtime/recurrent.py).

ggml_compute_forward_ssm_conv_f32 writes `sumf += s[i0] * c[i0]`; llama.cpp's CPU build (GCC, x86-64
with AVX-512 and FMA; read from its libggml-cpu.so) vectorizes the taps in chunks: while 16 taps
remain, 16 products are rounded and added to the sum one after another (vmulps, then vaddss in tap
order), then 8 the same way if 8 remain, and each of the last (fewer than 8) taps is one fma
(vfmadd231ss). lfm2's 3 taps are three fmas. The synthetic lfm2 files' logits agree with llama.cpp's
bit for bit (tests/frontend/test_families.py).
"""

from __future__ import annotations

import numpy as np

from kinetic.ir.numerics.dots import _reduce_add_16 as reduce_add_16
from kinetic.ir.numerics.floats import F32, fma_f32, libm_f32


def short_conv_row(window: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """One row's output: window f32 [kernel_size, channels] (the oldest value first, the row's own
    last), kernel f32 [channels, kernel_size]; returns f32 [channels]."""
    taps = window.shape[0]
    acc = np.zeros(window.shape[1], F32)

    def rounded_products(first: int, count: int) -> np.ndarray:
        out = acc
        for t in range(first, first + count):
            out = (out + (window[t] * kernel[:, t]).astype(F32)).astype(F32)
        return out

    tap = 0
    while taps - tap >= 16:
        acc, tap = rounded_products(tap, 16), tap + 16
    if taps - tap >= 8:
        acc, tap = rounded_products(tap, 8), tap + 8
    for t in range(tap, taps):
        acc = fma_f32(window[t], kernel[:, t], acc)
    return acc


SCAN_CHUNK = 64  # ggml's AVX-512 GGML_F32_STEP: 4 accumulators of 16 lanes over each chunk of states


def softplus(x: np.ndarray) -> np.ndarray:
    """ggml_compute_softplus_f32: x above 20, else logf(1 + expf(x)) with the C library's functions."""
    x = np.asarray(x, F32)
    soft = libm_f32("logf", (F32(1) + libm_f32("expf", x)).astype(F32))
    return np.where(x > F32(20), x, soft).astype(F32)


def ssm_scan_row(state: np.ndarray, x: np.ndarray, dt: np.ndarray, a: np.ndarray, b: np.ndarray,
                 c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One row of ggml_ssm_scan for Mamba-2 (a scalar decay per head), as llama.cpp's AVX-512 build
    runs it (read from its libggml-cpu.so): state f32 [n_head, head_dim, d_state], x f32 [n_head,
    head_dim], dt and a f32 [n_head], b and c f32 [n_head, d_state] (each head's group). Per head,
    sp = softplus(dt), dA = expf(sp * a), x_dt = x * sp; each state value becomes
    fma(s, dA, b * x_dt) (GCC contracts the intrinsics' multiply and add: vmulps, then vfmadd231ps),
    and y is the dot of the new states with c: over whole chunks of 64, 4 x 16 fma lanes, then
    ggml's reduction (lanes 0+2 and 1+3 added, those two added, _mm512_reduce_add_ps's halving);
    the states past the last whole chunk one fma each onto that sum, in order. Returns y f32
    [n_head, head_dim] and the new state."""
    n_head, head_dim, d_state = state.shape
    sp = softplus(dt)
    decay = libm_f32("expf", (sp * a).astype(F32))  # [n_head]
    x_dt = (x * sp[:, None]).astype(F32)  # [n_head, head_dim]
    new = fma_f32(state, np.broadcast_to(decay[:, None, None], state.shape),
                  (b[:, None, :] * x_dt[:, :, None]).astype(F32))
    cc = np.broadcast_to(c[:, None, :], new.shape)
    main = d_state - d_state % SCAN_CHUNK
    lanes = np.zeros((n_head, head_dim, SCAN_CHUNK), F32)
    for start in range(0, main, SCAN_CHUNK):
        lanes = fma_f32(new[..., start:start + SCAN_CHUNK], cc[..., start:start + SCAN_CHUNK], lanes)
    quads = lanes.reshape(n_head, head_dim, 4, 16)
    y = reduce_add_16(((quads[..., 0, :] + quads[..., 2, :]).astype(F32)
                       + (quads[..., 1, :] + quads[..., 3, :]).astype(F32)).astype(F32))
    for i in range(main, d_state):
        y = fma_f32(new[..., i], cc[..., i], y)
    return y, new


def vec_dot_f32(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32 over the last axis as llama.cpp's AVX-512 build runs it (the F32 matmul's dot,
    kinetic/ir/numerics/dots.py): whole chunks of 64 in 4 x 16 fma lanes reduced as ggml's lanes are,
    then the rest in order, the first whole 16s and 8 of it as rounded products added (GCC's
    vectorized tail), the last fewer than 8 one fma each. Returns f32 [...]."""
    n = x.shape[-1]
    main = n - n % SCAN_CHUNK
    lanes = np.zeros((*np.broadcast_shapes(x.shape, y.shape)[:-1], SCAN_CHUNK), F32)
    for start in range(0, main, SCAN_CHUNK):
        lanes = fma_f32(x[..., start:start + SCAN_CHUNK], y[..., start:start + SCAN_CHUNK], lanes)
    quads = lanes.reshape(*lanes.shape[:-1], 4, 16)
    total = reduce_add_16(((quads[..., 0, :] + quads[..., 2, :]).astype(F32)
                           + (quads[..., 1, :] + quads[..., 3, :]).astype(F32)).astype(F32))
    rest = n - main
    unfused = main + rest // 16 * 16 + (8 if rest % 16 >= 8 else 0)
    for i in range(main, n):
        if i < unfused:
            total = (total + (x[..., i] * y[..., i]).astype(F32)).astype(F32)
        else:
            total = fma_f32(x[..., i], y[..., i], total)
    return total.astype(F32)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """ggml's op_sigmoid: 1 / (1 + expf(-x)) with the C library's expf, each step rounded to f32."""
    x = np.asarray(x, F32)
    return (F32(1) / (F32(1) + libm_f32("expf", (F32(0) - x).astype(F32)))).astype(F32)


def delta_rule_row(state: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, decay: np.ndarray,
                   beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One row of ggml_gated_delta_net (one decay per head) as llama.cpp's CPU build runs it:
    state f32 [n_head, S, S] stored as ggml stores it, M[j][i] = S[i][j] (a value row j of key
    columns i); q, k f32 [n_head, S] (each head's key head, L2-normed), v f32 [n_head, S], decay and
    beta f32 [n_head] (expf of the gate, the C library's, and the sigmoid's write strength). Per head:
    M *= decay (one rounding each); delta[j] = (v[j] - dot(M[j], k)) * beta; M[j][i] = fma(k[i], delta[j], M[j][i])
    (ggml_vec_mad_f32); out[j] = dot(M[j], q) * (1 / sqrtf(S)), the dots ggml_vec_dot_f32's.
    Returns out f32 [n_head, S] and the new state."""
    size = state.shape[-1]
    decayed = (state * decay[:, None, None]).astype(F32)
    delta = ((v - vec_dot_f32(decayed, k[:, None, :])).astype(F32) * beta[:, None]).astype(F32)  # [n_head, S]
    new = fma_f32(np.broadcast_to(k[:, None, :], decayed.shape), np.broadcast_to(delta[:, :, None], decayed.shape),
                  decayed)
    scale = F32(1) / F32(np.sqrt(F32(size)))
    out = (vec_dot_f32(new, q[:, None, :]) * scale).astype(F32)
    return out, new
