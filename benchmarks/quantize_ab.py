"""The activation quantizer's two paths A/B in one process (kinetic/codegen/cpu/activation_ir.py):
sixteen blocks a lane each (`_q8_0_group`, the kernel the step runs) against one block at a time
(`render_quantize(..., grouped=False)`), each one call over the whole pass, alternating runs on one
thread (the thread's CPU time, so outside load inflates both alike); medians, and whether the two
gave the same bits.

    python benchmarks/quantize_ab.py [--rows 512] [--k 576] [--runs 101] [--fmt q8_1]
"""

from __future__ import annotations

import argparse
import ctypes
import time

import numpy as np

from kinetic.codegen.cpu.activation_ir import render_quantize
from kinetic.codegen.cpu.jit import default_jit

SIG = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--k", type=int, default=576)
    parser.add_argument("--runs", type=int, default=101)
    parser.add_argument("--fmt", choices=("q8_0", "q8_1"), default="q8_1")
    args = parser.parse_args()
    kernels = {path: SIG(default_jit().address(*render_quantize(args.fmt, grouped=path == "grouped")))
               for path in ("grouped", "one block")}
    x = np.random.default_rng(0).standard_normal((args.rows, args.k)).astype(np.float32)
    nb = args.rows * args.k // 32
    outs = {path: (np.zeros(args.rows * args.k, np.int8), np.zeros(nb, np.float32), np.zeros(nb, np.float32))
            for path in ("grouped", "one block")}

    def run(path: str) -> None:
        q, d, e = outs[path]
        kernels[path](x.ctypes.data, q.ctypes.data, d.ctypes.data, e.ctypes.data, nb)

    times = {"grouped": [], "one block": []}
    for _ in range(args.runs):
        for path in times:
            start = time.thread_time()
            run(path)
            times[path].append(time.thread_time() - start)
    print(f"{args.fmt}, {args.rows} rows of K {args.k} ({nb} blocks), one thread, {args.runs} runs")
    for path, ts in times.items():
        print(f"  {path:10s} median {1e6 * np.median(ts):8.1f} us  {1e9 * np.median(ts) / nb:6.2f} ns a block")
    ratio = np.median(np.array(times["grouped"]) / np.array(times["one block"]))
    same = all(np.array_equal(a, b) for a, b in zip(*outs.values(), strict=True))
    print(f"  grouped / one block, median of paired runs: {ratio:.3f}; same bits: {same}")


if __name__ == "__main__":
    main()
