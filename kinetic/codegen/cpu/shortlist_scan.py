"""Shortlist's copy scan on every thread: rows claimed in chunks, no Python between them.

Owns: `scan_rows(kernel, args, n, threads)`, running a generated row kernel (`kernel(*args, n0, n1,
n)`, the lane scorer or a matmul) over rows [0, n) on the calling thread and `threads - 1` persistent
workers (each chunk's group maxima summarized by the thread that scored it, shortlist_rows), and
`LaneInputs`, one row's activations put into the lane kernel's layout with their norms in one
compiled call. Does not own the kernels (shortlist_kernel_ir.py, matmul_ir.py) nor what the scores
are used for (shortlist.py).

Why not the compiled step's own threads: they run the step's tape (step_threads.run_parallel), and
the copy scan is not an op of the cut graph; these workers wait the same way (a blocking queue, then
compiled code with no Python inside a scan).

Why not matmul._split's fixed halves: on a shared machine a worker is often off its core when the
scan starts, and with fixed halves the calling thread waits for it (a whole time slice, several ms,
against a 3 ms scan). Here each thread claims chunks of CHUNK_ROWS rows from an atomic counter until
none is left, and the calling thread waits only for chunks already claimed: a worker that arrives
late finds nothing left and leaves without touching anything but the counters (which it holds).
The chunks' scores are the same whichever thread computes them: a row's float operations do not
depend on the range it is computed in (the kernels' contract, matmul_ir.py).
"""

from __future__ import annotations

import queue
import threading
from typing import NamedTuple

import numpy as np
from numba import njit

from kinetic.codegen.cpu.native import atomic_add, atomic_load, call_kernel, call_void, sched_yield_address, spin_pause
from kinetic.codegen.cpu.shortlist_kernel_ir import BLOCK, pack_activations, padded_blocks
from kinetic.codegen.cpu.shortlist_rows import GROUP, summarize

# numba's cache checks only this file's stamp, not those of the modules whose code or constants it
# compiles in (summarize, native's intrinsics, BLOCK); this hash of them (kept current by
# tests/codegen/cpu/test_shortlist_cache_keys.py) changes this file whenever they change, so a stale
# cache is never loaded (an edited summarize left out of a cached scan would mis-key the groups).
SOURCES_HASH = "61f55a4822228fd1"

CHUNK_ROWS = 2048  # rows a thread claims at a time (Gemma's copy: 0.7 MB, about 25 us)
assert CHUNK_ROWS % GROUP == 0  # a chunk summarizes whole groups
SPINS = 2000  # pause hints before a waiting caller starts yielding its core
YIELD = sched_yield_address()


@njit(nogil=True, cache=True)
def _take_chunks(kernel, args, n, chunk, counters, groups):
    """kernel(*args, n0, n1, n) over chunks claimed from counters[0] (an address: claimed rows, done
    rows) until none is left, each chunk's groups summarized where `groups` has any; each finished
    chunk's rows are added to counters[1]."""
    while True:
        n0 = atomic_add(counters, chunk)
        if n0 >= n:
            return
        n1 = min(n0 + chunk, n)
        call_kernel(kernel, args[0], args[1], args[2], args[3], args[4], args[5], n0, n1, n)
        if groups.keys.size:
            summarize(groups.scores, n0, n1, groups.keys)
        atomic_add(counters + 8, n1 - n0)


@njit(nogil=True, cache=True)
def _take_chunks_and_wait(kernel, args, n, chunk, counters, groups, yield_address):
    """_take_chunks, then wait until every claimed chunk is done (spin, then yield the core)."""
    _take_chunks(kernel, args, n, chunk, counters, groups)
    spins = 0
    while atomic_load(counters + 8) < n:
        spins += 1
        if spins < SPINS or yield_address == 0:
            spin_pause()
        else:
            call_void(yield_address)


def _worker(inbox: queue.SimpleQueue) -> None:
    while True:
        _keep, call = inbox.get()  # _keep: the counters and arrays a late worker may still touch
        _take_chunks(*call)


_workers: list[queue.SimpleQueue] = []
_lock = threading.Lock()


def _pool(n: int) -> list[queue.SimpleQueue]:
    with _lock:
        while len(_workers) < n:
            inbox = queue.SimpleQueue()
            thread = threading.Thread(target=_worker, args=(inbox,), daemon=True,
                                      name=f"kinetic-shortlist-{len(_workers) + 1}")
            thread.start()
            _workers.append(inbox)
        return _workers[:n]


class Groups(NamedTuple):
    """What the scan's threads summarize per group of rows (shortlist_rows.summarize): the scores the
    kernel writes (f32 [N]) and the keys of their maxima it fills (i32 [groups]). NO_GROUPS: nothing
    to summarize."""

    scores: np.ndarray
    keys: np.ndarray


NO_GROUPS = Groups(np.empty(0, np.float32), np.empty(0, np.int32))


def scan_rows(kernel: int, args: tuple[int, ...], n: int, threads: int, keep: object = None,
              groups: Groups = NO_GROUPS) -> None:
    """kernel(*args, n0, n1, n) (a generated kernel's address, six int64 arguments before the row
    range) over rows [0, n), shared by the calling thread and threads - 1 workers in chunks, each
    chunk's `groups` summarized by the thread that scored it. `keep`: the arrays behind args, held
    by each worker until it has left."""
    counters = np.zeros(2, np.int64)  # claimed rows, done rows: new per scan, so a late worker of an
    # earlier scan never claims this one's rows
    call = (kernel, args, n, CHUNK_ROWS, counters.ctypes.data, groups)
    for inbox in _pool(max(0, threads - 1) if n > CHUNK_ROWS else 0):
        inbox.put(((counters, keep), call))
    _take_chunks_and_wait(*call, YIELD)


@njit(cache=True)
def _lane_inputs(q, d, places, nb, xp, xinit, xd, xblocks):
    """One q8_0 row (q i8 [K], d f32 [K/32]) into the lane layout (xp[j] = q[places[j]], 0 where
    places[j] < 0), each block's -8 * sum q (xinit) and d (xd), 0 for pads, and the f64 norms of its
    values q * d: per block into xblocks, the row's returned."""
    for j in range(places.size):
        xp[j] = q[places[j]] if places[j] >= 0 else 0
    xinit[:] = 0
    xd[:] = 0
    total = 0.0
    for b in range(nb):
        s = 0
        sq = 0.0
        scale = np.float64(d[b])
        for i in range(b * BLOCK, (b + 1) * BLOCK):
            s += np.int32(q[i])
            v = np.float64(q[i]) * scale
            sq += v * v
        xinit[b] = -8 * s
        xd[b] = d[b]
        xblocks[b] = np.sqrt(sq)
        total += sq
    return np.sqrt(total)


class LaneInputs:
    """The lane kernel's per-token inputs for rows of K = 32 * n_blocks, made by one compiled call:
    xp i8 (the activations in the lane steps), xinit i32, xd f32 (per padded block), and the f64
    norms ||x_b|| and ||x|| of the q8_0 values (not yet inflated by the bound's SLACK)."""

    def __init__(self, q: np.ndarray, d: np.ndarray, places: np.ndarray):
        """One row's inputs from its q8_0 values (q i8 [K], d f32 [K/32]); `places`: lane_places(K/32)."""
        padded = padded_blocks(d.size)
        self.xp = np.empty(padded * BLOCK, np.int8)
        self.xinit = np.empty(padded, np.int32)
        self.xd = np.empty(padded, np.float32)
        self.xblocks = np.empty(d.size, np.float64)
        self.xnorm = _lane_inputs(q.reshape(-1), d.reshape(-1), places, d.size, self.xp, self.xinit, self.xd,
                                  self.xblocks)


def lane_places(n_blocks: int) -> np.ndarray:
    """Where each byte of the packed activations comes from: i64 [padded blocks * 32], an element
    number of the row, or -1 for a pad."""
    return pack_activations(np.arange(1, n_blocks * BLOCK + 1, dtype=np.int64)) - 1
