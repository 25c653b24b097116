"""Every float32 bit pattern through the generated vector expf (kinetic/codegen/cpu/expf_ir.py) and
through this process's C library expf; prints how many differ (bits compared, NaNs included) and the
wall time. Run once by hand, not in CI (a minute or two a width):

    python benchmarks/expf_exhaustive.py [--lanes 16 8] [--chunk-bits 24] [--sse2]

--sse2 checks the unfused rendering (glibc's SSE2 build's operations) instead, which differs from
the FMA build's expf on two inputs (expf_ir.SSE2_DIFFERS).

The C library side is `common.libm.render_libm_map("expf")`: compiled calls of the process's own expf,
the function the reference (numerics.libm_f32) reaches through ctypes.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from kinetic.codegen.common.libm import render_libm_map
from kinetic.codegen.cpu.expf_ir import compiled_map, render_expf_map
from kinetic.codegen.cpu.target import host


def check(lanes: int, chunk_bits: int, fused: bool) -> int:
    vector, libm = compiled_map(render_expf_map(lanes, fused)), compiled_map(render_libm_map("expf"))
    chunk = 1 << chunk_bits
    first: list[int] = []
    bad = 0
    start = time.perf_counter()
    for base in range(0, 2**32, chunk):
        bits = np.arange(base, base + chunk, dtype=np.uint64).astype(np.uint32)
        x = bits.view(np.float32)
        differ = vector(x).view(np.uint32) != libm(x).view(np.uint32)
        n = int(np.count_nonzero(differ))
        if n:
            bad += n
            first += bits[differ][: max(8 - len(first), 0)].tolist()
    seconds = time.perf_counter() - start
    print(f"{lanes} lanes{'' if fused else ' (unfused)'}: {bad} of 2^32 bit patterns differ; {seconds:.1f} s"
          + (f"; first: {[hex(b) for b in first]}" if bad else ""))
    return bad


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lanes", type=int, nargs="+", default=[16, 8])
    ap.add_argument("--chunk-bits", type=int, default=24)
    ap.add_argument("--sse2", action="store_true", help="the unfused rendering (glibc's SSE2 build)")
    args = ap.parse_args()
    print(f"{platform.libc_ver()}, {host().cpu}, fma: {'fma' in host().flags}")
    bad = sum(check(lanes, args.chunk_bits, not args.sse2) for lanes in args.lanes)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
