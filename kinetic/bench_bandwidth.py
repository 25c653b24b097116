"""Decode's bandwidth share in `kinetic bench`: bytes a generated token reads, and the machine's read bandwidth.

Owns: `DecodeTraffic` (the bytes one timed decode step reads: every weight once, the output layer as
Shortlist actually read it, one embedding row, the KV cache entries attended to), `bandwidth_share`
(that times tokens per second, as GB/s and as a share of the machine's), and
`measure_read_bandwidth` (the machine's figure, measured once per process and thread count).
Does not own the timing of decode (kinetic.bench) nor the reports (kinetic.bench_report, bench_card).

How the machine's read bandwidth is measured: a buffer of max(256 MiB, 8 x the last-level cache)
(so almost nothing of it stays cached between passes), filled with ones so every page is resident,
is summed as 64-bit words by a numba kernel, split into `threads` contiguous slices summed by that
many reader threads at once (numba releases the GIL), as the decode step's threads share the memory.
Each reader is pinned to its own CPU (the first `threads` CPUs this process may run on, so on the
usual numbering each its own core; unpinned when there are fewer CPUs than threads): a reader the
scheduler moves mid-pass, or two on one core, was the largest part of the spread between runs. Each
pass reads the whole buffer once (every pass's sum is checked). After one untimed pass that compiles
the kernel, passes go on for MIN_SECONDS (at least MIN_PASSES, at most MAX_PASSES), so a pass at a
quiet moment of a shared machine is among them: the figure is the fastest pass, and `ReadBandwidth`
keeps every pass so reports can give the median and the slowest beside it (the spread).
Hand-written rather than taken from a library (STREAM, likwid-bench) because none is a Python
dependency and the figure must come from the same threads and process that decode: a read-only sum
is the access decode makes of its weights (no writes, so no write-allocate traffic counts against it).
"""

from __future__ import annotations

import functools
import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit

MIN_BUFFER_BYTES = 256 * 2**20
CACHE_MULTIPLE = 8  # the buffer is at least this many times the last-level cache
MIN_PASSES = 5
MAX_PASSES = 400
MIN_SECONDS = 1.0  # of timed passes: a 256 MiB pass takes ~10 ms at 30 GB/s, so ~100 passes
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
    machine_passes: ReadBandwidth | None = None  # the measurement's passes, when known (for the spread)

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
        line = f"{head}, {100 * self.share:.0f} % of the {machine:.1f} GB/s this machine reads"
        return line if self.machine_passes is None else f"{line} ({self.machine_passes.note()})"

    def to_json(self) -> dict:
        return {
            "decode_bytes_per_token": round(self.bytes_per_token),
            "decode_gb_per_s": round(self.bytes_per_second / 1e9, 3),
            "machine_read_gb_per_s": round(self.machine_bytes_per_second / 1e9, 3)
            if self.machine_bytes_per_second else None,
            "bandwidth_share": round(self.share, 4) if self.share is not None else None,
            **(self.machine_passes.to_json() if self.machine_passes else {}),
        }


def bandwidth_share(traffic: DecodeTraffic, tokens_per_second: float, machine: float | None,
                    passes: ReadBandwidth | None = None) -> BandwidthShare:
    return BandwidthShare(traffic.bytes_per_token(), tokens_per_second, machine, passes)


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


@dataclass(frozen=True)
class ReadBandwidth:
    """One measurement: bytes/s of each timed pass in order, the seconds they took in all, and the CPUs
    the readers were pinned to (empty: not pinned)."""

    rates: tuple[float, ...]
    seconds: float
    cpus: tuple[int, ...]

    @property
    def best(self) -> float:
        return max(self.rates)

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    @property
    def slowest(self) -> float:
        return min(self.rates)

    def note(self) -> str:
        """`best of 97 passes in 1.0 s, pinned; median 52.3, slowest 31.0 GB/s`."""
        pinned = "pinned" if self.cpus else "not pinned"
        return (f"best of {len(self.rates)} passes in {self.seconds:.1f} s, {pinned}; median {self.median / 1e9:.1f}, "
                f"slowest {self.slowest / 1e9:.1f} GB/s")

    def to_json(self) -> dict:
        return {"machine_read_passes": len(self.rates), "machine_read_median_gb_per_s": round(self.median / 1e9, 3),
                "machine_read_slowest_gb_per_s": round(self.slowest / 1e9, 3), "machine_read_pinned": bool(self.cpus)}


def measure_read_bandwidth(threads: int) -> float:
    """Bytes per second `threads` threads read from memory together: the fastest pass of `read_bandwidth`."""
    return read_bandwidth(threads).best


@functools.cache
def read_bandwidth(threads: int) -> ReadBandwidth:
    """Every timed pass of `threads` pinned readers over the buffer, measured once per process and
    thread count (the module docstring says how)."""
    threads = max(1, threads)
    words = np.ones(buffer_bytes() // 8, np.uint64)
    with _Readers(np.array_split(words, threads), reader_cpus(threads)) as readers:
        rates: list[float] = []
        begin = time.perf_counter()
        for i in range(MAX_PASSES + 1):  # pass 0 compiles the kernel (or loads it from numba's cache)
            seconds, total = readers.read()
            if total != words.size:
                raise AssertionError("the bandwidth pass did not read every word")
            if i == 0:
                begin = time.perf_counter()
                continue
            rates.append(words.nbytes / seconds)
            if len(rates) >= MIN_PASSES and time.perf_counter() - begin >= MIN_SECONDS:
                break
        return ReadBandwidth(tuple(rates), time.perf_counter() - begin, readers.cpus)


def reader_cpus(threads: int) -> tuple[int, ...]:
    """The CPUs the readers are pinned to: the first `threads` this process may run on; () when it may
    run on fewer (or the platform cannot pin)."""
    if not hasattr(os, "sched_getaffinity"):
        return ()
    allowed = sorted(os.sched_getaffinity(0))
    return tuple(allowed[:threads]) if threads <= len(allowed) else ()


class _Readers:
    """`len(slices)` threads, reader i pinned to cpus[i] (when cpus is given), each summing its slice
    once per `read()`; two barriers with the calling thread start and end a pass together. A pass's
    time is from the first reader's start to the last reader's end, each read by the reader itself:
    the calling thread's own clock would run late when the readers take every CPU and it waits for
    one after the start barrier (it made passes look 10 times faster than memory)."""

    def __init__(self, slices: list[np.ndarray], cpus: tuple[int, ...]):
        self.slices, self.cpus = slices, cpus
        self.sums = [0] * len(slices)
        self.spans = [(0.0, 0.0)] * len(slices)  # each reader's (start, end) of the last pass
        self.start = threading.Barrier(len(slices) + 1)
        self.done = threading.Barrier(len(slices) + 1)
        self.stop = False
        self.threads = [threading.Thread(target=self._work, args=(i,), daemon=True, name=f"kinetic-bandwidth-{i}")
                        for i in range(len(slices))]

    def __enter__(self) -> _Readers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop = True
        self.start.wait()
        for t in self.threads:
            t.join()

    def read(self) -> tuple[float, int]:
        """(seconds, words summed) of one pass of every reader."""
        self.start.wait()
        self.done.wait()
        return max(end for _, end in self.spans) - min(start for start, _ in self.spans), sum(self.sums)

    def _work(self, i: int) -> None:
        if self.cpus:
            os.sched_setaffinity(0, {self.cpus[i]})  # 0: this thread alone (Linux)
        while True:
            self.start.wait()
            if self.stop:
                return
            began = time.perf_counter()
            self.sums[i] = int(_sum_words(self.slices[i]))
            self.spans[i] = (began, time.perf_counter())
            self.done.wait()
