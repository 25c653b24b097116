"""Sequence state: a preallocated KV cache per sequence, appended to and rolled back by length.

Owns: cache layout (per layer, [n_ctx, n_kv_head * head_dim] in the cache dtype, plus the position
of each entry), committing a pass's rows, and rollback to a length (speculative decoding keeps only
the accepted rows). A cache carries its sequence's recurrent states too (`recurrent`,
kinetic/runtime/recurrent.py: they cannot be cut back; the engine commits and rewinds them). Does
not own what the model computes. Runners see a KVCache only through the protocols of
kinetic/ir/rows.py (`SequenceKV`, `KVView`), which it and `SequenceCaches` implement.
"""

from __future__ import annotations

import os

import numpy as np

from kinetic.errors import KineticError
from kinetic.runtime.recurrent import RecurrentState


def available_memory() -> int | None:
    """Bytes of memory the system reports available (Linux), None when it cannot tell."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def check_cache_fits(n_ctx: int, kv_width_total: int, itemsize: int) -> None:
    """Refuse a context whose keys and values would not fit in memory, before allocating them."""
    need = 2 * n_ctx * kv_width_total * itemsize
    free = available_memory()
    if free is not None and need > free:
        raise KineticError(
            f"a context of {n_ctx} tokens needs {need / 1024**3:.1f} GiB for its KV cache, "
            f"more than the {free / 1024**3:.1f} GiB of memory available",
            "Use a smaller context (-c N).",
        )


class KVCache:
    """The cache of one sequence: entries [0, length) are committed."""

    def __init__(self, kv_width: dict[int, int], n_ctx: int, dtype=np.float16,
                 recurrent: dict[str, tuple[int, int]] | None = None):
        self.n_ctx = n_ctx
        # the sequence's recurrent states (graphs with recurrent layers; empty otherwise): recurrent.py
        self.recurrent = RecurrentState(recurrent or {})
        self.k = {layer: np.zeros((n_ctx, w), dtype) for layer, w in kv_width.items()}
        self.v = {layer: np.zeros((n_ctx, w), dtype) for layer, w in kv_width.items()}
        self.positions = np.zeros(n_ctx, np.int32)
        self.length = 0
        # rows the host itself writes (commit, keep_written), for a device that keeps a copy: a count,
        # and the lowest slot the latest of those writes touched
        self.host_writes = 0
        self.host_written_from = 0
        self._addresses: dict[tuple, np.ndarray] = {}

    def committed(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = self.length
        return self.k[layer][:n], self.v[layer][:n], self.positions[:n]

    def layers(self) -> list[int]:
        return list(self.k)

    def storage(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """The layer's whole key and value arrays [n_ctx, width] (a device copies them from here)."""
        return self.k[layer], self.v[layer]

    def write_pass_rows(self, new_kv: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        """Write a pass's keys and values [T, width] per layer at slots length + i, as an in-place
        runner's pass does, without committing them (commit_written / keep_written do). Not a host
        write: the runner that computed them holds them already."""
        start = self.length
        for layer, (k, v) in new_kv.items():
            self.k[layer][start : start + len(k)] = k
            self.v[layer][start : start + len(v)] = v

    def addresses(self, layers: list[int]) -> np.ndarray:
        """int64 [len(layers), 2]: where each layer's keys and values start (compiled code writes and
        reads them in place). The arrays never move, so this is worked out once per layer list."""
        key = tuple(layers)
        if key not in self._addresses:
            self._addresses[key] = np.array([[self.k[i].ctypes.data, self.v[i].ctypes.data] for i in layers],
                                            np.int64).reshape(len(layers), 2)  # [0, 2] for a graph without attention
        return self._addresses[key]

    def check_room(self, n: int) -> None:
        """Fail before a pass whose n new rows would not fit."""
        if self.length + n > self.n_ctx:
            raise KineticError(
                f"the context is full: {self.length} + {n} tokens exceed -c {self.n_ctx}",
                "Use a larger context (-c N) or a shorter prompt.",
            )

    def commit(self, new_kv: dict[int, tuple[np.ndarray, np.ndarray]], rows: np.ndarray,
               positions: np.ndarray) -> None:
        """Append the given pass rows (in order) to the cache."""
        n = len(rows)
        self.check_room(n)
        end = self.length + n
        self._host_write(self.length)
        for layer, (k, v) in new_kv.items():
            self.k[layer][self.length : end] = k[rows]
            self.v[layer][self.length : end] = v[rows]
        self.positions[self.length : end] = positions[rows]
        self.length = end

    def commit_written(self, positions: np.ndarray) -> None:
        """Append len(positions) entries whose keys and values a pass already wrote in place."""
        n = len(positions)
        self.check_room(n)
        self.positions[self.length : self.length + n] = positions
        self.length += n

    def keep_written(self, rows: np.ndarray, positions: np.ndarray) -> None:
        """Append some rows of an uncommitted in-place pass (pass row i was written at slot length + i):
        `rows` in path order (increasing, as a tree lists parents before children) move down to
        consecutive slots from length. A chain whose kept rows are a prefix moves nothing."""
        rows = np.asarray(rows, np.int64)
        n = len(rows)
        self.check_room(n)
        src = self.length + rows
        dst = self.length + np.arange(n)
        moved = src != dst
        if moved.any():  # fancy indexing copies the sources out before any is overwritten
            src, dst = src[moved], dst[moved]
            self._host_write(int(dst.min()))
            for layer in self.k:
                self.k[layer][dst] = self.k[layer][src]
                self.v[layer][dst] = self.v[layer][src]
        self.positions[self.length : self.length + n] = positions
        self.length += n

    def _host_write(self, first_slot: int) -> None:
        self.host_writes += 1
        self.host_written_from = first_slot

    def truncate(self, length: int) -> None:
        """Roll back to the first `length` entries."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to {length}: the cache holds {self.length}")
        self.length = length


class SequenceCaches:
    """The KVView a pass's runner reads: sequence id -> its KVCache."""

    def __init__(self, caches: dict[int, KVCache]):
        self.caches = caches

    def committed(self, seq: int, layer: int):
        return self.caches[seq].committed(layer)

    def sequence(self, seq: int) -> KVCache:
        return self.caches[seq]

    def recurrent(self, seq: int, name: str) -> np.ndarray:
        return self.caches[seq].recurrent.values[name]
