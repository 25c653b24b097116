"""The prompt GEMM alone, A/B in one process: the generated quantized matmul kernels on real weight
tensors for M prompt rows, full tiles through the 512-bit tiles (matmul_wide_ir,
matmul_q{2..6}k_lanes_ir) against matmul_tiles_ir, alternating runs, medians and bests reported
(one thread: the thread's CPU time), and whether both gave the same bits. `--order block_chain`
compares that order's kernels (issue 23's fast numerics mode; matmul_b32_lanes_ir's 16-row tiles)
with the ggml order's instead, on the types where it is another order (their bits differ by
design). `--only TEXT` keeps the cases whose "model tensor" contains TEXT (e.g. `--only ffn_down`);
"synthetic" cases are random blocks of a type (or a shape) the local models lack.

    python benchmarks/matmul_prompt_ab.py [--rows 512] [--threads 1] [--runs 9] [--only TEXT] [--order O]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic import hub
from kinetic.codegen.cpu.jit import default_jit
from kinetic.codegen.cpu.matmul import _kernel, _ptr, _split, quantize_activations
from kinetic.codegen.cpu.matmul_ir import ordered_layout
from kinetic.codegen.cpu.quant_blocks import LAYOUTS
from kinetic.codegen.cpu.target import host, kernel_orders
from kinetic.frontend.gguf_file import open_gguf

CASES = [("smollm2-135m", "token_embd.weight"), ("smollm2-135m", "blk.0.ffn_gate.weight"),
         ("smollm2-135m", "blk.0.ffn_down.weight"),
         ("smollm2-135m", "blk.0.attn_q.weight"), ("gemma3-270m", "blk.0.ffn_gate.weight"),
         ("gemma3-270m", "blk.0.attn_v.weight"), ("gemma3-270m", "blk.1.attn_v.weight"),
         ("gemma3-270m", "blk.0.attn_output.weight"), ("gemma3-270m", "blk.0.ffn_down.weight"),
         ("synthetic", "Q5_K 640x2048"), ("synthetic", "Q3_K 640x2048"),
         ("synthetic", "Q2_K 640x2048"), ("synthetic", "Q8_0 2048x640"),
         ("synthetic", "Q8_0 576x1536")]  # types (or shapes) neither model has
# the synthetic cases: random bytes with f16 scales of 0.01 at these byte offsets of each block
F16_FIELDS = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q8_0: (0,)}


def _weight(model: str, name: str) -> tuple[np.ndarray, Q]:
    """u8 [N, row bytes] and the type: a real model's tensor, or "TYPE NxK" random blocks."""
    if model == "synthetic":
        type_name, shape = name.split()
        wtype = Q[type_name]
        n, k = map(int, shape.split("x"))
        layout = LAYOUTS[wtype]
        blocks = np.random.default_rng(1).integers(0, 256, (n, k // layout.block, layout.block_bytes), np.uint8)
        for at in F16_FIELDS[wtype]:
            blocks[:, :, at : at + 2] = np.array([0.01], np.float16).view(np.uint8)
        return blocks.reshape(n, -1), wtype
    gguf = open_gguf(hub.resolve_model(model))
    raw, wtype = np.array(gguf.array(name)), gguf.tensors[name].type
    return raw.reshape(raw.shape[0], -1), wtype


def _time(kernel, args, n, threads) -> float:
    """Seconds: wall time with several threads; with one, this thread's CPU time (a shared machine
    preempts it, and CPU time does not count the time it waits)."""
    clock = time.thread_time if threads == 1 else time.perf_counter
    t0 = clock()
    _split(kernel, args, n, threads)
    return clock() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--tile", type=int, default=8)
    ap.add_argument("--only", default="", help="keep the cases whose 'model tensor' contains this")
    ap.add_argument("--order", default="", help="compare this reduction order's kernels (e.g. block_chain: "
                    "issue 23's fast mode) with the ggml order's instead of the wide paths with the tiles")
    args = ap.parse_args()
    jit, variant = default_jit(), host().best_variant()
    print(f"load average {os.getloadavg()[0]:.2f}; M={args.rows}, threads={args.threads}, variant {variant}")
    labels = ("ggml", args.order) if args.order else ("tiles", "wide")
    for model, name in [c for c in CASES if args.only in f"{c[0]} {c[1]}"]:
        raw, wtype = _weight(model, name)
        if args.order and (args.order not in kernel_orders(wtype)
                           or ordered_layout(wtype, args.order).dot_order is None):
            continue  # no kernel in that order, or it is the type's ggml order
        layout = LAYOUTS[wtype]
        n, k = raw.shape[0], raw.shape[1] // layout.block_bytes * layout.block
        x = np.random.default_rng(0).standard_normal((args.rows, k)).astype(np.float32)
        acts = quantize_activations(x, layout.activation, jit)
        if args.order:  # B: the order's kernel, A: the ggml order's (both on their fastest paths)
            kernels = [_kernel(wtype, k, variant, args.tile, jit), _kernel(wtype, k, variant, args.tile, jit,
                                                                            order=args.order)]
        else:  # B: the wide paths, A: matmul_tiles_ir's (the same bits)
            kernels = [_kernel(wtype, k, variant, args.tile, jit, wide) for wide in (False, True)]
        outs = [np.empty((args.rows, n), np.float32) for _ in kernels]
        call = [(_ptr(raw), _ptr(acts.q), _ptr(acts.d), _ptr(acts.extra), _ptr(out), args.rows) for out in outs]
        times = [[], []]
        for _ in range(args.runs):
            for i in (0, 1):
                times[i].append(_time(kernels[i], call[i], n, args.threads))
        same = np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
        med = [float(np.median(t)) for t in times]
        gops = [2 * args.rows * n * k / m / 1e9 / args.threads for m in med]
        print(f"{name:22s} {wtype.name:5s} N={n:5d} K={k:5d}  median ms {labels[0]} {1e3 * med[0]:7.2f} "
              f"{labels[1]} {1e3 * med[1]:7.2f} x{med[0] / med[1]:.2f}; GOP/s a thread {labels[0]} {gops[0]:5.0f} "
              f"{labels[1]} {gops[1]:5.0f}; same bits: {same}")


if __name__ == "__main__":
    main()
