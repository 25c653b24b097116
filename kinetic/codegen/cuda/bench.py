"""`python -m kinetic.codegen.cuda.bench`: time the matmul kernels on the GPU here.

Owns: a quick reading per weight format (random weights of a 7B-class projection, the best of many
launches timed with CUDA events): the GEMV on one decode row, printed as microseconds, GB/s of weight
bytes read and the share of the `--peak` bandwidth; and a prompt of PROMPT_ROWS rows through the GEMV
(every row reads every weight) and through the GEMM (a tile of rows per weight read), in microseconds.
Does not own: model benchmarks (`kinetic bench`, `benchmarks/cuda_runtime.py`). Needs a GPU; says
why not otherwise.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from kinetic.codegen.cuda import device, gemv
from kinetic.ir.quants import QUANT_TYPES

SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336)]
PROMPT_ROWS = 128


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


def _activations(rng, wtype, k: int, rows: int) -> list:
    """Quantized activation rows as the matmul kernels read them: xq, xd (and Q8_1's xs), on the GPU."""
    import cupy

    fmt = gemv.activation_format(wtype)
    acts = [cupy.asarray(rng.integers(-127, 128, (rows, k), dtype=np.int8)),
            cupy.full((rows, k // (256 if fmt == "q8_k" else 32)), 0.01, cupy.float32)]
    if fmt == "q8_1":
        acts.append(cupy.zeros((rows, k // 32), cupy.float32))
    return acts


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
    kernels = [make(t, n, k) for make in (gemv.gemv, gemv.gemm) for t in types for n, k in SHAPES]
    program = device.GpuProgram(kernels)
    rng = np.random.default_rng(0)
    rows = PROMPT_ROWS
    print(f"{'type':6} {'n_out x k':>12} {'us':>8} {'GB/s':>8} {'of peak':>8} {f'GEMV {rows} us':>13} "
          f"{f'GEMM {rows} us':>13}")
    for t in types:
        block, block_bytes = QUANT_TYPES[t].block, QUANT_TYPES[t].block_bytes
        for n, k in SHAPES:
            raw = cupy.asarray(rng.integers(0, 256, (n, k // block * block_bytes), dtype=np.uint8))
            one, prompt = _activations(rng, t, k, 1), _activations(rng, t, k, rows)
            y = cupy.zeros((rows, n), cupy.float32)
            us = _time(program, gemv.gemv(t, n, k), 1, [raw, *one, y[:1]], args.repeats)
            gemv_us = _time(program, gemv.gemv(t, n, k), rows, [raw, *prompt, y], args.repeats)
            gemm_us = _time(program, gemv.gemm(t, n, k), rows, [raw, *prompt, y, rows], args.repeats)
            gbs = raw.nbytes / us / 1e3
            print(f"{t.name:6} {f'{n}x{k}':>12} {us:8.1f} {gbs:8.0f} {gbs / args.peak:8.0%} {gemv_us:13.1f} "
                  f"{gemm_us:13.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
