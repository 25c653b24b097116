"""The per-pass tables the compiled step's attention and KV store read, built once per pass.

Owns: `PassTables`: each row's cache slot and cache index, the pass rows of each slot in order,
who sees whom among the pass rows (ancestors), and each slot's cache length, positions and key /
value addresses, read through the declared KVView (kinetic/ir/rows.py). Does not own the caches
(the runtime does) nor the visibility rules themselves (step_attention.py applies them).

Python that runs right after a pass runs cold (the pass has swept the CPU caches: a trivial numpy
call costs ~30 us instead of ~4), so the usual pass, one sequence's consecutive rows, takes a short
path of few numpy calls whose n-only tables are kept.
"""

from __future__ import annotations

import numpy as np

from kinetic.ir.rows import KVView, PassRows

_CHAIN_TABLES: dict[int, tuple] = {}  # n -> (row_slot, slot_rows, anc): compiled code only reads them


class PassTables:
    """Per-pass arrays the compiled attention reads (all int arrays compiled code indexes)."""

    def __init__(self, rows: PassRows, caches: KVView, layers: list[int]):
        n = len(rows.tokens)
        if rows.chain_seq >= 0:
            self._one_chain(caches.sequence(rows.chain_seq), layers, n)  # the usual pass
            return
        seqs = [int(s) for s in dict.fromkeys(rows.seqs.tolist())]
        slot_of = {s: i for i, s in enumerate(seqs)}
        self.row_slot = np.array([slot_of[int(s)] for s in rows.seqs], np.int32)
        counts = np.bincount(self.row_slot, minlength=len(seqs))
        self.slot_rows = np.full((len(seqs), max(counts)), -1, np.int32)
        self.clen = np.zeros(len(seqs), np.int64)
        self.cpos_addr = np.zeros(len(seqs), np.int64)
        self.kv_addr = np.zeros((len(seqs), len(layers), 2), np.int64)
        self.row_cidx = np.zeros(n, np.int32)
        filled = np.zeros(len(seqs), np.int64)
        for s, seq in enumerate(seqs):
            cache = caches.sequence(seq)
            cache.check_room(int(counts[s]))  # rows are written even when the pass is not committed
            self.clen[s] = cache.length
            self.cpos_addr[s] = cache.positions.ctypes.data
            self.kv_addr[s] = cache.addresses(layers)
        for r in range(n):
            s = self.row_slot[r]
            self.slot_rows[s, filled[s]] = r
            self.row_cidx[r] = self.clen[s] + filled[s]
            filled[s] += 1
        self.anc = rows.pass_sight()  # who sees whom among the pass rows (rows.py)

    def _one_chain(self, cache, layers: list[int], n: int) -> None:
        """One sequence's consecutive rows (a prompt chunk or a decode step)."""
        cache.check_room(n)
        if n not in _CHAIN_TABLES:
            _CHAIN_TABLES[n] = (np.zeros(n, np.int32), np.arange(n, dtype=np.int32)[None, :],
                                np.tri(n, dtype=np.uint8))
        self.row_slot, self.slot_rows, self.anc = _CHAIN_TABLES[n]
        self.clen = np.array([cache.length], np.int64)
        self.cpos_addr = np.array([cache.positions.ctypes.data], np.int64)
        self.kv_addr = cache.addresses(layers)[None]
        self.row_cidx = self.slot_rows[0] + np.int32(cache.length)
