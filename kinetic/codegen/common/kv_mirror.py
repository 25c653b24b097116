"""A device's copy of the sequences' KV caches, kept in step with the host's: one protocol for every
device that keeps the caches in its own memory (CUDA, Vulkan).

Owns: the pool the copies live in (per layer one key buffer and one value buffer holding `capacity`
caches of n_ctx f16 rows each, end to end: cache slot s is pool rows [s * n_ctx, (s + 1) * n_ctx)),
giving each live cache (a SequenceKV, kinetic/ir/rows.py) a slot on first use, bringing the copies of
a pass's caches up to date before it (`KVMirrors.mirror_all`), freeing the slot of a cache that is
gone, and growing the pool when more caches live at once than it holds. Does not own device memory
or copies (the device's `alloc`, `write` and `free`), which rows a pass reads and writes
(common/pass_caches.py), nor the cache's bookkeeping (the runtime's KVCache: length, positions,
rollback).

Why one pool: a pass of several sequences (Convoy) runs one launch per layer whose rows attend over
different caches; with every cache in the same two buffers per layer, a row addresses its own cache
by its first pool row alone (a number per row), and what a launch binds does not depend on which
sequences share the pass (CUDA records a plan once per pass shape, not per set of sequences).

The protocol: the host arrays stay the source of truth. A pass stores its rows' keys and values on
the device at its cache's slots length + i, attention reads them there, and the runner copies the
same rows back into the host cache in place, so the two agree without copying anything up. The host
counts the writes it makes itself (`host_writes`: commit, keep_written moving a draft tree's kept
rows down) and remembers the lowest slot the latest one touched (`host_written_from`): one write
since the last pass copies the rows from that slot up to length; more than one, or the first pass,
copies every committed row. A plain decode step copies nothing. Rollback needs nothing: the length
governs what attention reads. Growing the pool makes new buffers and copies every live cache's
committed rows up again (from the host, which holds them all) at its next pass.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Sequence

import numpy as np

from kinetic.errors import KineticError
from kinetic.ir.rows import SequenceKV


class KVMirror:
    """One cache's copy: its `slot` in the pool (`base`, its first pool row). Rows [0, cache.length)
    equal the host's once sync() has run (`seen`: the cache's host_writes then; None before the
    first copy, or after the pool grew)."""

    _serials = itertools.count()

    def __init__(self, cache: SequenceKV, slot: int, pool: KVMirrors):
        self.serial = next(self._serials)  # names what a device records for it (ids of dead objects come back)
        self.cache = weakref.ref(cache)
        self.slot = slot
        self.seen: int | None = None
        self._pool = pool

    @property
    def base(self) -> int:
        """The pool row where this cache's entry 0 lives."""
        return self.slot * self._pool.n_ctx

    def sync(self, cache: SequenceKV) -> None:
        """Copy up the rows the host wrote itself since the last pass (see the module docstring)."""
        writes = cache.host_writes
        if writes == self.seen:
            return
        start = cache.host_written_from if self.seen is not None and writes == self.seen + 1 else 0
        self.upload(cache, start, cache.length)
        self.seen = writes

    def upload(self, cache: SequenceKV, start: int, end: int) -> None:
        """Copy host rows [start, end) of every layer the pool keeps to the device."""
        if end <= start:
            return
        pool = self._pool
        for layer in pool.layers_kept:
            k, v = cache.storage(layer)
            row = k.strides[0]
            pool.write(pool.k[layer], (self.base + start) * row, k[start:end])
            pool.write(pool.v[layer], (self.base + start) * row, v[start:end])


class KVMirrors:
    """A runner's pool of device copies of the caches it has seen, by cache identity.

    `alloc(nbytes)` makes a device buffer, `write(buffer, byte_offset, host_rows)` copies rows into
    one, `free(buffer)` releases one (None: the device frees a buffer when it is dropped);
    `layers` are the layers the runner keeps (None: every layer of the cache); `on_grow()` runs once
    the pool has new buffers (what a device recorded with the old ones goes); `max_buffer_bytes` is
    the most one buffer may hold (a device's binding limit; None: no limit). `error` is the exception
    a cache the device cannot keep raises, `device` names the runner in messages. `k[layer]` and
    `v[layer]` are the pool's buffers, u16 rows [capacity * n_ctx, width]."""

    def __init__(self, *, alloc: Callable, write: Callable, free: Callable | None = None,
                 layers: list[int] | None = None, on_grow: Callable[[], None] | None = None,
                 max_buffer_bytes: int | None = None, error: Callable[[str], Exception] = KineticError,
                 device: str = "the device"):
        self.alloc, self.write, self.free, self.layers = alloc, write, free, layers
        self.on_grow, self.max_buffer_bytes = on_grow, max_buffer_bytes
        self.error, self.device = error, device
        self.by_cache: dict[int, KVMirror] = {}
        self.k: dict[int, object] = {}
        self.v: dict[int, object] = {}
        self.capacity = 0  # caches the buffers hold
        self.n_ctx = 0  # entries per cache (every cache of one runner has the same)
        self.layers_kept: list[int] = []

    def mirror(self, cache: SequenceKV) -> KVMirror:
        """The device copy of `cache`, made on first use and brought up to date (see mirror_all)."""
        return self.mirror_all([cache])[0]

    def mirror_all(self, caches: Sequence[SequenceKV]) -> list[KVMirror]:
        """The device copies of the caches one pass reads, in order: the copies of caches that no
        longer exist are dropped (their slots freed), a cache seen for the first time gets a free slot
        (the pool grows when none is left), and every copy is brought up to date with the rows the
        host wrote since its last pass."""
        for key, m in list(self.by_cache.items()):
            if m.cache() is None:  # the cache is gone (its id may already name a new one)
                del self.by_cache[key]
        new = list({id(c): c for c in caches if id(c) not in self.by_cache}.values())
        for cache in new:
            self._check(cache)
        if len(self.by_cache) + len(new) > self.capacity:
            self._grow(len(self.by_cache) + len(new), (new or list(caches))[0])
        free = sorted(set(range(self.capacity)) - {m.slot for m in self.by_cache.values()})
        for cache, slot in zip(new, free, strict=False):
            self.by_cache[id(cache)] = KVMirror(cache, slot, self)
        mirrors = [self.by_cache[id(c)] for c in caches]
        for m, cache in zip(mirrors, caches, strict=True):
            m.sync(cache)
        return mirrors

    def _check(self, cache: SequenceKV) -> None:
        layers = self.layers if self.layers is not None else cache.layers()
        if any(cache.storage(layer)[0].dtype != np.float16 for layer in layers):
            raise self.error(f"{self.device} keeps an f16 cache")
        if self.n_ctx and cache.n_ctx != self.n_ctx:
            raise ValueError(f"a cache of {cache.n_ctx} entries beside caches of {self.n_ctx}")

    def _grow(self, capacity: int, example: SequenceKV) -> None:
        """New buffers for `capacity` caches; every live copy is copied up again at its next pass."""
        layers = self.layers if self.layers is not None else example.layers()
        row_bytes = {layer: example.storage(layer)[0].strides[0] for layer in layers}
        nbytes = {layer: capacity * example.n_ctx * row for layer, row in row_bytes.items()}
        if self.max_buffer_bytes is not None and max(nbytes.values(), default=0) > self.max_buffer_bytes:
            most = self.max_buffer_bytes // (example.n_ctx * max(row_bytes.values()))
            raise KineticError(f"{self.device} holds the caches of at most {most} sequences of "
                               f"{example.n_ctx} entries at once ({capacity} asked)",
                               "Use fewer parallel slots (--parallel N) or a smaller context (-c N).")
        self._release()
        for m in self.by_cache.values():
            m.seen = None
        self.layers_kept, self.n_ctx = list(layers), example.n_ctx
        try:
            for layer, n in nbytes.items():
                self.k[layer] = self.alloc(n)
                self.v[layer] = self.alloc(n)
        except MemoryError as e:  # CuPy's OutOfMemoryError is one
            self._release()
            raise KineticError(f"the caches of {capacity} sequences of {example.n_ctx} entries do not fit in "
                               f"{self.device}'s memory", "Use fewer parallel slots (--parallel N) or a smaller "
                               "context (-c N).") from e
        except Exception:
            self._release()
            raise
        self.capacity = capacity
        if self.on_grow is not None:
            self.on_grow()

    def _release(self) -> None:
        if self.free is not None:
            for buf in [*self.k.values(), *self.v.values()]:
                self.free(buf)
        self.k, self.v, self.capacity = {}, {}, 0

    def close(self) -> None:
        """Drop every copy and free the pool's buffers."""
        self.by_cache.clear()
        self._release()
