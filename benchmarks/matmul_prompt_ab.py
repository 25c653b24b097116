"""The prompt GEMM alone, A/B in one process: the generated quantized matmul kernels on real weight
tensors for M prompt rows, full tiles through the 512-bit tiles (matmul_wide_ir, matmul_q4k_lanes_ir)
against matmul_tiles_ir, alternating runs, medians and bests reported (one thread: the thread's CPU
time), and whether both gave the same bits.

    python benchmarks/matmul_prompt_ab.py [--rows 512] [--threads 1] [--runs 9]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from kinetic import hub
from kinetic.codegen.cpu.jit import default_jit
from kinetic.codegen.cpu.matmul import _kernel, _ptr, _split, quantize_activations
from kinetic.codegen.cpu.quant_blocks import LAYOUTS
from kinetic.codegen.cpu.target import host
from kinetic.frontend.gguf_file import open_gguf

CASES = [("smollm2-135m", "blk.0.ffn_gate.weight"), ("smollm2-135m", "blk.0.ffn_down.weight"),
         ("smollm2-135m", "blk.0.attn_q.weight"), ("gemma3-270m", "blk.0.ffn_gate.weight"),
         ("gemma3-270m", "blk.0.attn_v.weight"), ("gemma3-270m", "blk.1.attn_v.weight"),
         ("gemma3-270m", "blk.0.attn_output.weight"), ("gemma3-270m", "blk.0.ffn_down.weight")]


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
    args = ap.parse_args()
    jit, variant = default_jit(), host().best_variant()
    print(f"load average {os.getloadavg()[0]:.2f}; M={args.rows}, threads={args.threads}, variant {variant}")
    for model, name in CASES:
        gguf = open_gguf(hub.resolve_model(model))
        raw, wtype = np.array(gguf.array(name)), gguf.tensors[name].type
        raw = raw.reshape(raw.shape[0], -1)
        layout = LAYOUTS[wtype]
        n, k = raw.shape[0], raw.shape[1] // layout.block_bytes * layout.block
        x = np.random.default_rng(0).standard_normal((args.rows, k)).astype(np.float32)
        acts = quantize_activations(x, layout.activation, jit)
        outs, times = {}, {True: [], False: []}
        kernels = {wide: _kernel(wtype, k, variant, args.tile, jit, wide) for wide in (True, False)}
        for wide in (True, False):
            outs[wide] = np.empty((args.rows, n), np.float32)
        call = {wide: (_ptr(raw), _ptr(acts.q), _ptr(acts.d), _ptr(acts.extra), _ptr(outs[wide]), args.rows)
                for wide in (True, False)}
        for _ in range(args.runs):
            for wide in (True, False):
                times[wide].append(_time(kernels[wide], call[wide], n, args.threads))
        same = np.array_equal(outs[True].view(np.uint32), outs[False].view(np.uint32))
        med = {w: float(np.median(t)) for w, t in times.items()}
        best = {w: float(np.min(t)) for w, t in times.items()}
        gmacs = {w: args.rows * n * k / best[w] / 1e9 for w in best}
        print(f"{name:22s} {wtype.name:5s} N={n:5d} K={k:5d}  median ms tiles {1e3 * med[False]:6.2f} "
              f"wide {1e3 * med[True]:6.2f} x{med[False] / med[True]:.2f}; best GMAC/s tiles {gmacs[False]:5.1f} "
              f"wide {gmacs[True]:5.1f} x{best[False] / best[True]:.2f}; same bits: {same}")


if __name__ == "__main__":
    main()
