"""Where each row of a pass reads and writes the device's cache pool (common/kv_mirror.py): one
record per pass, shared by the devices that keep a pool (CUDA, Vulkan).

Owns: `PassCaches.of(rows, kv, mirrors)`: the pass's sequences (in the order of their first rows),
each one's cache, pool copy and rows; per row, the pool row its key and value are stored at (its
cache's first pool row + length + k, for the sequence's k-th row of the pass: the slot the runtime
commits it from) and its cache's first pool row (`base`); the visibility of every row over its own
cache (`mask`); and the pass's new keys and values written into each sequence's host cache
(`write_back`). Does not own the pool (kv_mirror.py), which entries a row may see (kinetic/ir/rows.py:
visibility), nor the kernels that read these tables.

Isolation (Convoy: several sequences in one pass): key j of row r is pool row base[r] + j, inside its
own cache's slot range, and the columns of its mask are its own cache's entries (committed, then its
sequence's rows of the pass), so a kernel that reads base + j for each visible j reads only the row's
own cache. A row's visible keys, their order and their values are those of a pass of its sequence
alone; only the number of mask columns (`n_keys`, the fullest cache's) is the pass's, and kernels
skip the columns a row does not see without computing anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kinetic.codegen.common.kv_mirror import KVMirror, KVMirrors
from kinetic.ir.rows import KVView, PassRows, SequenceKV, visibility


@dataclass
class PassCaches:
    caches: list[SequenceKV]  # per sequence of the pass
    mirrors: list[KVMirror]  # its pool copy
    mine: list[np.ndarray]  # its rows of the pass, in order (i64)
    store: np.ndarray  # i32 [T]: the pool row each row's key and value go to
    base: np.ndarray  # i32 [T]: the pool row where the row's cache starts
    n_keys: int  # entries the fullest cache holds with its rows of the pass: the columns of a mask

    @staticmethod
    def of(rows: PassRows, kv: KVView, mirrors: KVMirrors) -> PassCaches:
        """The pass's caches, their copies brought up to date (a cache without room for its rows
        refuses the pass before anything runs)."""
        seqs = list(dict.fromkeys(int(s) for s in rows.seqs))
        caches = [kv.sequence(s) for s in seqs]
        mine = [np.flatnonzero(rows.seqs == s) for s in seqs]
        for cache, m in zip(caches, mine, strict=True):
            cache.check_room(len(m))
        copies = mirrors.mirror_all(caches)
        t = len(rows.tokens)
        store, base = np.zeros(t, np.int32), np.zeros(t, np.int32)
        for cache, copy, m in zip(caches, copies, mine, strict=True):
            base[m] = copy.base
            store[m] = copy.base + cache.length + np.arange(len(m))
        n_keys = max((c.length + len(m) for c, m in zip(caches, mine, strict=True)), default=0)
        return PassCaches(caches, copies, mine, store, base, n_keys)

    def mask(self, rows: PassRows, window: int, columns: int | None = None) -> np.ndarray:
        """bool [T, columns (default n_keys)]: row r sees column j, its cache's entry j (committed
        entries, then its sequence's rows of the pass in order), as rows.visibility says; columns
        past its own cache's entries are False."""
        out = np.zeros((len(rows.tokens), self.n_keys if columns is None else columns), bool)
        for cache, m in zip(self.caches, self.mine, strict=True):
            n_c = cache.length
            out[m, : n_c + len(m)] = visibility(rows, m, cache.positions[:n_c], window)
        return out

    def stored_ranges(self) -> list[tuple[np.ndarray, int]]:
        """Per sequence, its rows of the pass and the pool row the first of them was stored at (the
        others follow it)."""
        return [(m, int(self.store[m[0]])) for m in self.mine if len(m)]

    def write_back(self, new_kv: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        """Each layer's keys and values of the pass's rows [T, width] (as the device stored them)
        written into each sequence's host cache at its slots length + k, in place."""
        for cache, m in zip(self.caches, self.mine, strict=True):
            cache.write_pass_rows({layer: (k[m], v[m]) for layer, (k, v) in new_kv.items()})
