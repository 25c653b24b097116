"""Every float32 bit pattern through tanhf_steps (kinetic/codegen/common/tanhf.py: glibc's tanhf as
the float steps the CUDA and Vulkan kernels follow) and through this process's C library tanhf;
prints how many differ (bits compared, NaNs included) and the wall time. Run once by hand, not in CI
(about 25 CPU minutes for all 2^32; --computing checks only the inputs whose tanhf goes through
expm1f, 2^-55 <= |x| < 22, about a quarter of them):

    python benchmarks/tanhf_exhaustive.py [--chunk-bits 24] [--computing]

The C library side is `common.libm.libm_map("tanhf", x)`: compiled calls of the process's own tanhf,
the function the reference (numerics.softcap through numerics.libm_f32) reaches through ctypes.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from kinetic.codegen.common.libm import libm_map
from kinetic.codegen.common.tanhf import TANH_ONE, TANH_TINY, tanhf_steps


def check(chunk_bits: int, ranges: list[tuple[int, int]]) -> int:
    chunk, first, bad = 1 << chunk_bits, [], 0
    start = time.perf_counter()
    for base, stop in ((b, min(b + chunk, hi)) for lo, hi in ranges for b in range(lo, hi, chunk)):
        bits = np.arange(base, stop, dtype=np.uint64).astype(np.uint32)
        x = bits.view(np.float32)
        differ = tanhf_steps(x).view(np.uint32) != libm_map("tanhf", x).view(np.uint32)
        n = int(np.count_nonzero(differ))
        if n:
            bad += n
            first += bits[differ][: max(8 - len(first), 0)].tolist()
    total = sum(hi - lo for lo, hi in ranges)
    print(f"tanhf_steps vs the C library's tanhf ({platform.libc_ver()}): {bad} of {total} inputs "
          f"{[(hex(lo), hex(hi)) for lo, hi in ranges]} differ {[hex(b) for b in first]} in "
          f"{time.perf_counter() - start:.0f} s")
    return bad


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk-bits", type=int, default=24)
    parser.add_argument("--computing", action="store_true", help="only 2^-55 <= |x| < 22, both signs")
    args = parser.parse_args()
    low, high = TANH_TINY, TANH_ONE
    ranges = [(low, high), (low | 1 << 31, high | 1 << 31)] if args.computing else [(0, 2**32)]
    raise SystemExit(1 if check(args.chunk_bits, ranges) else 0)
