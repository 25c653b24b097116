"""Decode's bandwidth share in `kinetic bench`: bytes a generated token reads, and the machine's read bandwidth.

Owns: `DecodeTraffic` (the bytes one timed decode step reads: every weight once, the output layer as
Shortlist actually read it, one embedding row, the KV cache entries attended to), `bandwidth_share`
(that times tokens per second, as GB/s and as a share of the machine's), and
`measure_read_bandwidth` (the machine's figure, measured once per process and thread count).
Does not own the timing of decode (kinetic.bench) nor the reports (kinetic.bench_report, bench_card).

How the machine's read bandwidth is measured: a buffer of max(256 MiB, 8 x the last-level cache)
(so almost nothing of it stays cached between passes), filled with ones so every page is resident,
is summed as 64-bit words by a numba kernel, split into `threads` contiguous slices summed on that
many Python threads at once (numba releases the GIL), as the decode step's threads share the
memory. Each pass reads the whole buffer once; the figure is the buffer's bytes over the fastest of
PASSES passes, after one untimed pass that compiles the kernel. Hand-written rather than taken from
a library (STREAM, likwid-bench) because none is a Python dependency and the figure must come from
the same threads and process that decode: a read-only sum is the access decode makes of its
weights (no writes, so no write-allocate traffic counts against it).
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit

MIN_BUFFER_BYTES = 256 * 2**20
CACHE_MULTIPLE = 8  # the buffer is at least this many times the last-level cache
PASSES = 5
CACHE_SIZES = Path("/sys/devices/system/cpu/cpu0/cache")


@dataclass(frozen=True)
class ShortlistTraffic:
    """What Shortlist read over the timed decode steps: `shortlisted` of `steps` used the copy (the
    others scored the full layer), and scored `rows_scored` rows exactly in all (each `row_bytes`)."""

    steps: int
    shortlisted: int
    rows_scored: int
    row_bytes: int
    copy_bytes: int  # the copy and its per-row bounds, read whole by every shortlisted step


@dataclass(frozen=True)
class DecodeTraffic:
    """The bytes one timed decode step reads, on average (dense models: a mixture of experts' idle
    experts and a recurrent layer's state are not modelled)."""

    weight_bytes: int  # every weight but the output layer and the embedding table, each read once
    output_bytes: int  # the output layer's weight (the tied embedding when there is no output.weight)
    embedding_row_bytes: int  # one row of an untied embedding table (0 when tied: it is the output)
    kv_bytes_per_entry: int  # keys and values of one cache entry over every layer
    mean_entries: float  # cache entries a timed step attends to, on average
    shortlist: ShortlistTraffic | None = None  # None: every step scored the full output layer

    def output_bytes_per_token(self) -> float:
        s = self.shortlist
        if s is None or s.steps == 0:
            return float(self.output_bytes)
        full_steps = s.steps - s.shortlisted
        return (full_steps * self.output_bytes + s.shortlisted * s.copy_bytes + s.rows_scored * s.row_bytes) / s.steps

    def bytes_per_token(self) -> float:
        kv = self.kv_bytes_per_entry * self.mean_entries
        return self.weight_bytes + self.embedding_row_bytes + self.output_bytes_per_token() + kv


def mean_entries_attended(n_gen: int) -> float:
    """Cache entries a step of tg<n_gen> attends to, on average: after one untimed token, step i
    (0-based) sees i + 2 entries (the first token, the i decoded before it, itself)."""
    return (n_gen + 3) / 2


@dataclass(frozen=True)
class BandwidthShare:
    bytes_per_token: float
    tokens_per_second: float
    machine_bytes_per_second: float | None  # None: not measured

    @property
    def bytes_per_second(self) -> float:
        return self.bytes_per_token * self.tokens_per_second

    @property
    def share(self) -> float | None:
        m = self.machine_bytes_per_second
        return self.bytes_per_second / m if m else None

    def line(self) -> str:
        """`decode reads 96.2 MB a token: 25.1 GB/s, 72 % of the 34.9 GB/s this machine reads (2 threads)`."""
        head = f"decode reads {self.bytes_per_token / 1e6:.1f} MB a token: {self.bytes_per_second / 1e9:.1f} GB/s"
        if self.share is None:
            return head + " (the machine's read bandwidth was not measured)"
        machine = self.machine_bytes_per_second / 1e9
        return f"{head}, {100 * self.share:.0f} % of the {machine:.1f} GB/s this machine reads"

    def to_json(self) -> dict:
        return {
            "decode_bytes_per_token": round(self.bytes_per_token),
            "decode_gb_per_s": round(self.bytes_per_second / 1e9, 3),
            "machine_read_gb_per_s": round(self.machine_bytes_per_second / 1e9, 3)
            if self.machine_bytes_per_second else None,
            "bandwidth_share": round(self.share, 4) if self.share is not None else None,
        }


def bandwidth_share(traffic: DecodeTraffic, tokens_per_second: float, machine: float | None) -> BandwidthShare:
    return BandwidthShare(traffic.bytes_per_token(), tokens_per_second, machine)


# -- the machine's read bandwidth -----------------------------------------------------------------


@njit(nogil=True, cache=True)
def _sum_words(words):  # pragma: no cover - compiled
    total = np.uint64(0)
    for i in range(words.size):
        total += words[i]
    return total


def last_level_cache_bytes() -> int:
    """The largest cache level's size cpu0 reports (Linux sysfs), 0 when it reports none."""
    sizes = [0]
    for index in CACHE_SIZES.glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes)


def buffer_bytes() -> int:
    return max(MIN_BUFFER_BYTES, CACHE_MULTIPLE * last_level_cache_bytes())


@functools.cache
def measure_read_bandwidth(threads: int) -> float:
    """Bytes per second `threads` threads read from memory together (the module docstring says how)."""
    threads = max(1, threads)
    words = np.ones(buffer_bytes() // 8, np.uint64)
    slices = np.array_split(words, threads)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        total = _read_pass(pool, slices)  # compiles the kernel (or loads it from numba's cache)
        if total != words.size:
            raise AssertionError("the bandwidth pass did not read every word")
        best = float("inf")
        for _ in range(PASSES):
            start = time.perf_counter()
            _read_pass(pool, slices)
            best = min(best, time.perf_counter() - start)
    return words.nbytes / best


def _read_pass(pool: ThreadPoolExecutor, slices: list[np.ndarray]) -> int:
    return int(sum(f.result() for f in [pool.submit(_sum_words, s) for s in slices]))
