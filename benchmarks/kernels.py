"""Throughput of the generated quantized matmul kernels: GB/s of weight bytes read per second.

Runs `kinetic.codegen.cpu.quantized_matmul` (activation quantization + one kernel call per matmul,
threads splitting N) at the two real models' shapes, M = 1 (decode, GB/s) and M = 64 (a prompt tile,
GFLOP/s), 1 and 2 threads, against a numpy baseline (dequantize the weight, then a float32 matmul).
"kernel" columns time the compiled kernel alone (activations quantized once, pointers taken once,
each thread looping over the copies for its half of N, one join at the end; what remains per call is
the ctypes call, ~1 us): what a compiled step function with one barrier per op approaches, without
this Python entry point's per-call dispatch. Weights are
random bytes in each type's layout, in enough copies (>= 256 MB, rotated) that every call reads them
from memory, not cache, as a decode step does. Configurations are interleaved within each repeat and
the median over repeats is reported, because the machine is shared.

    python benchmarks/kernels.py [--repeats 7] [--baseline-repeats 3] [--only Q4_1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.jit import Jit
from kinetic.codegen.cpu.matmul import (
    DEFAULT_TILE,
    _kernel,
    _pool,
    quantize_activations,
    quantized_matmul,
    split_columns,
)
from kinetic.codegen.cpu.quant_blocks import LAYOUTS
from kinetic.codegen.cpu.target import host
from kinetic.ir.quants import dequantize

# (label, N, K, type): output rows x row length
SHAPES = [
    ("smollm2 ffn_up", 1536, 576, Q.Q4_1),
    ("smollm2 ffn_down", 576, 1536, Q.Q4_1),
    ("smollm2 output", 49152, 576, Q.Q8_0),
    ("gemma ffn_up", 2048, 640, Q.Q5_0),
    ("gemma attn_output", 640, 1024, Q.Q4_K),
    ("gemma ffn_down", 640, 2048, Q.Q6_K),
    ("gemma output", 262144, 640, Q.Q8_0),
]
COPY_BYTES = 256 << 20
F16_FIELDS = {Q.Q8_0: (0,), Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q4_K: (0, 2),
              Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def random_weights(rng: np.random.Generator, wtype: Q, n: int, k: int) -> list[np.ndarray]:
    """Copies of one random weight, u8 [n, row_bytes] each, together at least COPY_BYTES."""
    layout = LAYOUTS[wtype]
    blocks = rng.integers(0, 256, (n, k // layout.block, layout.block_bytes), dtype=np.uint8)
    for off in F16_FIELDS[wtype]:
        scales = (rng.standard_normal(blocks.shape[:2]) * 0.02).astype(np.float16)
        blocks[:, :, off : off + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    w = blocks.reshape(n, -1)
    return [w] + [w.copy() for _ in range(max(0, -(-COPY_BYTES // w.nbytes) - 1))]


def time_kernel(x, weights, wtype, threads, jit) -> float:
    """Seconds per matmul, one pass over all copies."""
    start = time.perf_counter()
    for w in weights:
        quantized_matmul(x, w, wtype, threads=threads, jit=jit)
    return (time.perf_counter() - start) / len(weights)


def time_kernel_only(x, weights, wtype, threads, jit) -> float:
    """Seconds per matmul for the kernel call alone, threads each looping over their column range."""
    layout = LAYOUTS[wtype]
    acts = quantize_activations(x, layout.activation, jit)
    kernel = _kernel(wtype, x.shape[1], host().best_variant(), DEFAULT_TILE, jit)
    out = np.empty((x.shape[0], weights[0].shape[0]), np.float32)
    extra = None if acts.extra is None else acts.extra.ctypes.data

    pointers = [w.ctypes.data for w in weights]  # outside the timing: `.ctypes.data` costs ~1 us each
    rest = (acts.q.ctypes.data, acts.d.ctypes.data, extra, out.ctypes.data, x.shape[0])

    def run(n0: int, n1: int) -> None:
        for w in pointers:
            kernel(w, *rest, n0, n1, out.shape[1])

    ranges = split_columns(out.shape[1], threads)
    start = time.perf_counter()
    futures = [_pool(threads).submit(run, *r) for r in ranges[1:]]
    run(*ranges[0])
    for f in futures:
        f.result()
    return (time.perf_counter() - start) / len(weights)


def time_baseline(x, weights, wtype) -> float:
    w = weights[0]
    start = time.perf_counter()
    values = dequantize(w, wtype).reshape(w.shape[0], -1)
    x @ values.T
    return time.perf_counter() - start


def bench_shape(label, n, k, wtype, args, jit) -> list[str]:
    rng = np.random.default_rng(0)
    weights = random_weights(rng, wtype, n, k)
    nbytes = weights[0].nbytes
    configs = [(m, t, kind) for kind in ("call", "kernel") for m in (1, 64) for t in (1, 2)]
    xs = {m: rng.standard_normal((m, k)).astype(np.float32) for m in (1, 64)}
    for m, t, _kind in configs:  # compile and warm up outside the timing
        quantized_matmul(xs[m], weights[0], wtype, threads=t, jit=jit)
    timers = {"call": time_kernel, "kernel": time_kernel_only}
    samples = {c: [] for c in configs}
    for _ in range(args.repeats):
        for m, t, kind in configs:
            samples[(m, t, kind)].append(timers[kind](xs[m], weights, wtype, t, jit))
    base = statistics.median(time_baseline(xs[1], weights, wtype) for _ in range(args.baseline_repeats))
    per_call = {c: statistics.median(s) for c, s in samples.items()}
    cells = [f"{nbytes / sec / 1e9:.1f}" if c[0] == 1 else f"{2 * c[0] * n * k / sec / 1e9:.0f}"
             for c, sec in per_call.items()]
    us = per_call[(1, 1, "call")] * 1e6
    return [label, f"{n}x{k}", wtype.name, f"{nbytes / 1e6:.2f}", *cells, f"{nbytes / base / 1e9:.2f}", f"{us:.0f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--baseline-repeats", type=int, default=3)
    parser.add_argument("--only", help="run only this quant type (e.g. Q4_1)")
    args = parser.parse_args()
    jit = Jit(Path(tempfile.mkdtemp(prefix="kinetic-kernels-")))  # a cold cache: compile times are real
    h = host()
    print(f"host: {h.cpu}, variant {h.best_variant()}; weights rotated over >= {COPY_BYTES >> 20} MB; "
          f"median of {args.repeats} interleaved repeats")
    header = ["shape", "NxK", "type", "MB", "call M1 t1", "t2", "M64 GF t1", "t2", "kernel M1 t1", "t2",
              "M64 GF t1", "t2", "numpy M1", "us/call M1 t1"]
    rows = [bench_shape(*s, args, jit) for s in SHAPES if not args.only or s[3].name == args.only.upper()]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    times = sorted(jit.stats.compile_seconds)
    ms = [t * 1e3 for t in times]
    print(f"M1: GB/s of weight bytes; M64: GFLOP/s. compiled {jit.stats.compiled} kernels: "
          f"median {statistics.median(ms):.0f} ms, max {ms[-1]:.0f} ms")


if __name__ == "__main__":
    main()
