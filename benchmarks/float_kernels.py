"""Throughput of the float-weight matmul kernels (F16, BF16, F32) next to the Q8_0 kernel.

Kernel alone (activations rounded / quantized once, pointers taken once, each thread looping over the
weight copies for its share of N; weights rotated over >= 256 MB so every call reads from memory).
M = 1: GB/s of weight bytes; M = 64: GFLOP/s. One thread is timed by its CPU time (time.thread_time:
the time another process holds the core does not count), two by the wall clock. Median (or min) of
interleaved repeats (the machine is shared).

    python benchmarks/float_kernels.py [--repeats 5] [--stat min] [--k 576 2048] [--n 1536] [--types F16 Q8_0]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu import float_matmul_ir as F
from kinetic.codegen.cpu.jit import Jit
from kinetic.codegen.cpu.matmul import (
    DEFAULT_TILE,
    _float_kernel,
    _kernel,
    _pool,
    quantize_activations,
    round_activations,
    split_columns,
)
from kinetic.codegen.cpu.target import host

COPY_BYTES = 256 << 20
TYPES = (Q.F16, Q.BF16, Q.F32, Q.Q8_0)


def weights(rng, wtype: Q, n: int, k: int) -> list[np.ndarray]:
    if wtype is Q.Q8_0:
        blocks = rng.integers(-127, 128, (n, k // 32, 34), dtype=np.int8).view(np.uint8)
        scales = (rng.standard_normal((n, k // 32)) * 0.02).astype(np.float16)
        blocks[:, :, 0:2] = scales.view(np.uint8).reshape(n, -1, 2)
        w = blocks.reshape(n, -1)
    else:
        v = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        w = {Q.F16: v.astype(np.float16), Q.F32: v, Q.BF16: (v.view(np.uint32) >> 16).astype(np.uint16)}[wtype]
    return [w] + [w.copy() for _ in range(max(0, -(-COPY_BYTES // w.nbytes) - 1))]


def kernel_and_args(wtype: Q, x: np.ndarray, jit: Jit):
    k = x.shape[1]
    if wtype is Q.Q8_0:
        acts = quantize_activations(x, "q8_0", jit)
        kern = _kernel(wtype, k, host().best_variant(), DEFAULT_TILE, jit)
        return kern, (acts.q.ctypes.data, acts.d.ctypes.data, None), acts
    acts = round_activations(x, wtype, jit)
    kern = _float_kernel(wtype, k, F.best_variant(wtype, host().flags), jit)
    return kern, (acts.ctypes.data, None, None), acts


def time_kernel(wtype, x, ws, threads, jit) -> float:
    kern, acts_args, keep = kernel_and_args(wtype, x, jit)
    out = np.empty((x.shape[0], ws[0].shape[0]), np.float32)
    pointers = [w.ctypes.data for w in ws]
    rest = (*acts_args, out.ctypes.data, x.shape[0])

    def run(n0, n1):
        for w in pointers:
            kern(w, *rest, n0, n1, out.shape[1])

    ranges = split_columns(out.shape[1], threads)
    clock = time.thread_time if threads == 1 else time.perf_counter  # 1 thread: its CPU time
    start = clock()
    futures = [_pool(threads).submit(run, *r) for r in ranges[1:]]
    run(*ranges[0])
    for f in futures:
        f.result()
    del keep
    return (clock() - start) / len(pointers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--k", type=int, nargs="+", default=[576, 2048])
    parser.add_argument("--n", type=int, default=1536)
    parser.add_argument("--types", nargs="+", default=[t.name for t in TYPES])
    parser.add_argument("--stat", choices=["median", "min"], default="median",
                        help="min: the least disturbed repeat (a shared machine)")
    args = parser.parse_args()
    jit = Jit(Path(tempfile.mkdtemp(prefix="kinetic-fkernels-")))
    h = host()
    print(f"host {h.cpu}; float variants " + ", ".join(f"{t.name}: {F.best_variant(t, h.flags)}" for t in TYPES[:3])
          + f"; Q8_0: {h.best_variant()}; {args.stat} of {args.repeats}")
    print(f"{'type':>5} {'K':>5} {'MB':>6} {'M1 t1 GB/s':>11} {'M1 t2':>6} {'M64 t1 GF/s':>12} {'M64 t2':>7}")
    rng = np.random.default_rng(0)
    for k in args.k:
        for name in args.types:
            wtype = Q[name]
            ws = weights(rng, wtype, args.n, k)
            xs = {m: rng.standard_normal((m, k)).astype(np.float32) for m in (1, 64)}
            configs = [(m, t) for m in (1, 64) for t in (1, 2)]
            for m, t in configs:
                time_kernel(wtype, xs[m], ws[:2], t, jit)  # compile, warm up
            samples = {c: [] for c in configs}
            for _ in range(args.repeats):
                for m, t in configs:
                    samples[(m, t)].append(time_kernel(wtype, xs[m], ws, t, jit))
            pick = min if args.stat == "min" else statistics.median
            sec = {c: pick(s) for c, s in samples.items()}
            nb = ws[0].nbytes
            cells = [f"{nb / sec[(1, t)] / 1e9:.1f}" for t in (1, 2)]
            cells += [f"{2 * 64 * args.n * k / sec[(64, t)] / 1e9:.0f}" for t in (1, 2)]
            print(f"{name:>5} {k:>5} {nb / 1e6:>6.2f} {cells[0]:>11} {cells[1]:>6} {cells[2]:>12} {cells[3]:>7}")


if __name__ == "__main__":
    main()
