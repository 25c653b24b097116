"""`python -m kinetic.codegen.cuda.bench`: time the GEMV kernels of one decode row on the GPU here.

Owns: a quick bandwidth reading per weight format (random weights of a 7B-class projection, one
activation row, the best of many launches timed with CUDA events), printed as microseconds, GB/s of
weight bytes read and the share of the `--peak` bandwidth. Does not own: model benchmarks (`kinetic
bench`, once the CUDA runtime exists). Needs a GPU; says why not otherwise.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from kinetic.codegen.cuda import device, gemv

SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336)]


def _time(program, kernel, rows, args, repeats: int) -> float:
    import cupy

    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    best = float("inf")
    for _ in range(repeats):
        start.record()
        program.launch(kernel.name, rows, *args)
        stop.record()
        stop.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(start, stop) * 1e3)  # microseconds
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peak", type=float, default=4800.0, help="the GPU's memory bandwidth in GB/s [H200: 4800]")
    p.add_argument("--repeats", type=int, default=50)
    args = p.parse_args(argv)
    reason = device.unavailable_reason()
    if reason:
        print(f"no GPU benchmark: {reason}", file=sys.stderr)
        return 1
    import cupy

    types = sorted(gemv.SUPPORTED, key=lambda t: t.name)
    kernels = [gemv.gemv(t, n, k) for t in types for n, k in SHAPES]
    program = device.GpuProgram(kernels)
    rng = np.random.default_rng(0)
    print(f"{'type':6} {'n_out x k':>12} {'us':>8} {'GB/s':>8} {'of peak':>8}")
    for t in types:
        block = 256 if t in gemv.SUPERBLOCK else 32
        block_bytes = gemv.SUPERBLOCK.get(t) or gemv.BLOCK32[t].block_bytes
        for n, k in SHAPES:
            raw = cupy.asarray(rng.integers(0, 256, (n, k // block * block_bytes), dtype=np.uint8))
            fmt = gemv.activation_format(t)
            xq = cupy.asarray(rng.integers(-127, 128, (1, k), dtype=np.int8))
            acts = [xq, cupy.full((1, k // (256 if fmt == "q8_k" else 32)), 0.01, cupy.float32)]
            if fmt == "q8_1":
                acts.append(cupy.zeros((1, k // 32), cupy.float32))
            y = cupy.zeros((1, n), cupy.float32)
            us = _time(program, gemv.gemv(t, n, k), 1, [raw, *acts, y], args.repeats)
            gbs = raw.nbytes / us / 1e3
            print(f"{t.name:6} {f'{n}x{k}':>12} {us:8.1f} {gbs:8.0f} {gbs / args.peak:8.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
