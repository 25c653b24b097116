"""The prompt GEMM alone, A/B in one process: the generated quantized matmul kernels on real weight
tensors for M prompt rows, full tiles through the 512-bit tiles (matmul_wide_ir,
matmul_q{2..6}k_lanes_ir) against matmul_tiles_ir, alternating runs, medians and bests reported
(one thread: the thread's CPU time), and whether both gave the same bits. `--only TEXT` keeps the cases
whose "model tensor" contains TEXT (e.g. `--only ffn_down`); "synthetic" cases are random blocks of a
type the local models lack.

    python benchmarks/matmul_prompt_ab.py [--rows 512] [--threads 1] [--runs 9] [--only TEXT]
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
from kinetic.codegen.cpu.quant_blocks import LAYOUTS
from kinetic.codegen.cpu.target import host
from kinetic.frontend.gguf_file import open_gguf

CASES = [("smollm2-135m", "blk.0.ffn_gate.weight"), ("smollm2-135m", "blk.0.ffn_down.weight"),
         ("smollm2-135m", "blk.0.attn_q.weight"), ("gemma3-270m", "blk.0.ffn_gate.weight"),
         ("gemma3-270m", "blk.0.attn_v.weight"), ("gemma3-270m", "blk.1.attn_v.weight"),
         ("gemma3-270m", "blk.0.attn_output.weight"), ("gemma3-270m", "blk.0.ffn_down.weight"),
         ("synthetic", "Q5_K 640x2048"), ("synthetic", "Q3_K 640x2048"),
         ("synthetic", "Q2_K 640x2048")]  # types neither model has
# the synthetic cases: random bytes with f16 scales of 0.01 at these byte offsets of each block
F16_FIELDS = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


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
    args = ap.parse_args()
    jit, variant = default_jit(), host().best_variant()
    print(f"load average {os.getloadavg()[0]:.2f}; M={args.rows}, threads={args.threads}, variant {variant}")
    for model, name in [c for c in CASES if args.only in f"{c[0]} {c[1]}"]:
        raw, wtype = _weight(model, name)
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
