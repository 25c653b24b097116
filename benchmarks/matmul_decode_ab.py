"""The decode GEMV alone (one activation row), A/B in one process: the generated quantized matmul
kernel of a block-32 type in the ggml order against the same type in `--order` (default
block_chain, issue 23's fast numerics mode), on random weights large enough (--mb, default 24 MB)
that they stream from memory, not from the cache. Runs alternate; medians of this thread's CPU time
(a shared machine preempts it) and bests are reported as weight GB/s a thread. Types whose order is their
ggml order (Q4_0, IQ4_NL, Q4_K) show the same kernel twice: its GB/s against the others'. The
K-quants (Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) need --k a multiple of 256.
--threads T splits the columns as the compiled step does (T contiguous ranges, matmul._split) and
times the whole call by the clock instead (GB/s of all threads together: memory shared by them).
--shares N models one thread of two in a decode step: the weights cut into tensors of N rows (a
model's attn_k, ffn_gate, ...), each visited once in an order unlike memory's, the kernel called
from compiled code on the last half of each (a thread's share), the GB/s those halves' bytes; --mb
200 puts them past the last-level cache, as a model's layers are.

    python benchmarks/matmul_decode_ab.py [--k 576] [--mb 24] [--runs 15] [--types Q4_1,Q8_0] [--order O]
                                          [--threads 1 | --shares N]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import time

import numpy as np
from gguf import GGMLQuantizationType as Q
from numba import njit

from kinetic.codegen.cpu.jit import default_jit
from kinetic.codegen.cpu.matmul import _kernel, _ptr, _split, quantize_activations
from kinetic.codegen.cpu.native import call_kernel
from kinetic.codegen.cpu.quant_blocks import LAYOUTS
from kinetic.codegen.cpu.target import host

TYPES = "Q4_0,Q4_1,Q5_0,Q5_1,Q8_0,IQ4_NL"
F16_FIELDS = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,), Q.IQ4_NL: (0,),
              Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q3_K: (108,),
              Q.IQ4_XS: (0,)}  # byte offsets of f16 scales


def random_weight(wtype: Q, n: int, k: int) -> np.ndarray:
    """u8 [N, row bytes]: random blocks with f16 scales (and minimums) of 0.01."""
    layout = LAYOUTS[wtype]
    blocks = np.random.default_rng(1).integers(0, 256, (n, k // layout.block, layout.block_bytes), np.uint8)
    for at in F16_FIELDS[wtype]:
        blocks[:, :, at : at + 2] = np.array([0.01], np.float16).view(np.uint8)
    return blocks.reshape(n, -1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=576)
    ap.add_argument("--mb", type=float, default=24.0, help="weight megabytes (above the L3 cache: memory)")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--types", default=TYPES)
    ap.add_argument("--order", default="block_chain")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shares", type=int, default=0, help="rows a tensor: time one thread of two's shares")
    args = ap.parse_args()
    jit, variant = default_jit(), host().best_variant()
    print(f"load average {os.getloadavg()[0]:.2f}; M=1, K={args.k}, ~{args.mb:.0f} MB, variant {variant}")
    for type_name in args.types.split(","):
        wtype = Q[type_name]
        layout = LAYOUTS[wtype]
        row_bytes = args.k // layout.block * layout.block_bytes
        n = int(args.mb * 1e6 / row_bytes) // 8 * 8
        if args.shares:
            n = n // args.shares * args.shares
        w = random_weight(wtype, n, args.k)
        x = np.random.default_rng(0).standard_normal((1, args.k)).astype(np.float32)
        acts = quantize_activations(x, layout.activation, jit)
        kernels = [_kernel(wtype, args.k, variant, 8, jit, order=o) for o in (None, args.order)]
        outs = [np.empty((1, n), np.float32) for _ in kernels]
        times: list[list[float]] = [[], []]
        for _ in range(args.runs):
            for i, kernel in enumerate(kernels):
                call = (_ptr(w), _ptr(acts.q), _ptr(acts.d), _ptr(acts.extra), _ptr(outs[i]), 1)
                if args.shares:
                    times[i].append(_timed_shares(kernel, call, args.shares, n // args.shares, row_bytes))
                else:
                    times[i].append(_timed(kernel, call, n, args.threads))
        if args.shares:  # the bytes the shares read: half of each tensor
            w = w[: n // 2]
        gbs = [w.nbytes / float(np.median(t)) / 1e9 for t in times]
        best = [w.nbytes / min(t) / 1e9 for t in times]
        unit = "a thread" if args.threads == 1 else f"on {args.threads} threads"
        unit = f"in shares of {args.shares // 2} rows" if args.shares else unit
        print(f"{type_name:6s} N={n:6d} {w.nbytes / 1e6:5.1f} MB  GB/s {unit} (median, best): "
              f"ggml {gbs[0]:5.1f} {best[0]:5.1f}  {args.order} {gbs[1]:5.1f} {best[1]:5.1f}  "
              f"x{gbs[1] / gbs[0]:.2f} (best x{best[1] / best[0]:.2f})")


@njit(cache=True)
def _run_shares(kernel, w, q, d, e, out, row_bytes, rows, order):
    """kernel on rows [rows / 2, rows) of each tensor of `rows` rows, the tensors in `order`."""
    for t in order:
        call_kernel(kernel, w + t * rows * row_bytes, q, d, e, out, 1, rows // 2, rows, rows)


def _timed_shares(kernel, args: tuple, rows: int, tensors: int, row_bytes: int) -> float:
    """This thread's CPU seconds for the last half of every tensor, visited in a fixed shuffled order."""
    order = np.random.default_rng(3).permutation(tensors)
    address = ctypes.cast(kernel, ctypes.c_void_p).value
    w, q, d, e, out, _m = (a or 0 for a in args)
    t0 = time.thread_time()
    _run_shares(address, w, q, d, e, out, row_bytes, rows, order)
    return time.thread_time() - t0


def _timed(kernel, args: tuple, n: int, threads: int) -> float:
    """Seconds of one call over columns [0, n): this thread's CPU time alone, the clock on several."""
    if threads == 1:
        t0 = time.thread_time()
        kernel(*args, 0, n, n)
        return time.thread_time() - t0
    t0 = time.perf_counter()
    _split(kernel, args, n, threads)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
