"""The decode GEMV alone (one activation row), A/B in one process: the generated quantized matmul
kernel of a block-32 type in the ggml order against the same type in `--order` (default
block_chain, issue 23's fast numerics mode), on random weights large enough (--mb, default 24 MB)
that they stream from memory, not from the cache. Runs alternate; medians of this thread's CPU time
(a shared machine preempts it) and bests are reported as weight GB/s a thread. Types whose order is their
ggml order (Q4_0, IQ4_NL, MXFP4) show the same kernel twice: its GB/s against the others'.

    python benchmarks/matmul_decode_ab.py [--k 576] [--mb 24] [--runs 15] [--types Q4_1,Q8_0] [--order O]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.jit import default_jit
from kinetic.codegen.cpu.matmul import _kernel, _ptr, quantize_activations
from kinetic.codegen.cpu.quant_blocks import LAYOUTS
from kinetic.codegen.cpu.target import host

TYPES = "Q4_0,Q4_1,Q5_0,Q5_1,Q8_0,IQ4_NL"
F16_FIELDS = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,), Q.IQ4_NL: (0,)}


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
    args = ap.parse_args()
    jit, variant = default_jit(), host().best_variant()
    print(f"load average {os.getloadavg()[0]:.2f}; M=1, K={args.k}, ~{args.mb:.0f} MB, variant {variant}")
    for type_name in args.types.split(","):
        wtype = Q[type_name]
        layout = LAYOUTS[wtype]
        n = int(args.mb * 1e6 / (args.k // layout.block * layout.block_bytes)) // 8 * 8
        w = random_weight(wtype, n, args.k)
        x = np.random.default_rng(0).standard_normal((1, args.k)).astype(np.float32)
        acts = quantize_activations(x, layout.activation, jit)
        kernels = [_kernel(wtype, args.k, variant, 8, jit, order=o) for o in (None, args.order)]
        outs = [np.empty((1, n), np.float32) for _ in kernels]
        times: list[list[float]] = [[], []]
        for _ in range(args.runs):
            for i, kernel in enumerate(kernels):
                t0 = time.thread_time()
                kernel(_ptr(w), _ptr(acts.q), _ptr(acts.d), _ptr(acts.extra), _ptr(outs[i]), 1, 0, n, n)
                times[i].append(time.thread_time() - t0)
        gbs = [w.nbytes / float(np.median(t)) / 1e9 for t in times]
        best = [w.nbytes / min(t) / 1e9 for t in times]
        print(f"{type_name:6s} N={n:6d} {w.nbytes / 1e6:5.1f} MB  GB/s a thread (median, best): "
              f"ggml {gbs[0]:5.1f} {best[0]:5.1f}  {args.order} {gbs[1]:5.1f} {best[1]:5.1f}  "
              f"x{gbs[1] / gbs[0]:.2f} (best x{best[1] / best[0]:.2f})")


if __name__ == "__main__":
    main()
