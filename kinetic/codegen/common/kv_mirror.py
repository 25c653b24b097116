"""A device's copy of the sequences' KV caches, kept in step with the host's: one protocol for every
device that keeps the cache in its own memory (CUDA, Vulkan).

Owns: per sequence cache (a SequenceKV, kinetic/ir/rows.py) a device copy of its keys and values per
layer (capacity n_ctx, f16), made on first use, brought up to date before each pass (`KVMirrors.mirror`)
and dropped, its buffers freed, once the cache is gone. Does not own device memory or copies (the
device's `alloc`, `write` and `free`) nor the cache's bookkeeping (the runtime's KVCache: length,
positions, rollback).

The protocol: the host arrays stay the source of truth. A pass stores its rows' keys and values on
the device at slots length + i, attention reads them there, and the runner copies the same rows back
into the host cache in place, so the two agree without copying anything up. The host counts the
writes it makes itself (`host_writes`: commit, keep_written moving a draft tree's kept rows down)
and remembers the lowest slot the latest one touched (`host_written_from`): one write since the last
pass copies the rows from that slot up to length; more than one, or the first pass, copies every
committed row. A plain decode step copies nothing. Rollback needs nothing: the length governs what
attention reads.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable

import numpy as np

from kinetic.errors import KineticError
from kinetic.ir.rows import SequenceKV


class KVMirror:
    """One cache's keys and values on the device: per layer a buffer of n_ctx rows for each (`k`, `v`).
    Rows [0, cache.length) equal the host's once sync() has run (`seen`: the cache's host_writes
    then; None before the first copy)."""

    _serials = itertools.count()

    def __init__(self, cache: SequenceKV, layers: list[int], write: Callable):
        self.serial = next(self._serials)  # names what a device records for it (ids of dead objects come back)
        self.cache = weakref.ref(cache)
        self.layers = layers
        self.k: dict[int, object] = {}
        self.v: dict[int, object] = {}
        self.seen: int | None = None
        self._write = write

    def sync(self, cache: SequenceKV) -> None:
        """Copy up the rows the host wrote itself since the last pass (see the module docstring)."""
        writes = cache.host_writes
        if writes == self.seen:
            return
        start = cache.host_written_from if self.seen is not None and writes == self.seen + 1 else 0
        self.upload(cache, start, cache.length)
        self.seen = writes

    def upload(self, cache: SequenceKV, start: int, end: int) -> None:
        """Copy host rows [start, end) of every layer to the device."""
        if end <= start:
            return
        for layer, buf in self.k.items():
            k, v = cache.storage(layer)
            row = k.strides[0]
            self._write(buf, start * row, k[start:end])
            self._write(self.v[layer], start * row, v[start:end])


class KVMirrors:
    """A runner's device copies of the caches it has seen, by cache identity.

    `alloc(nbytes)` makes a device buffer, `write(buffer, byte_offset, host_rows)` copies rows into
    one, `free(buffer)` releases one (None: the device frees a buffer when it is dropped);
    `layers` are the layers the runner keeps (None: every layer of the cache); `on_drop(mirror)` runs
    before a mirror is dropped (what the device recorded for it goes too). `error` is the exception a
    cache the device cannot keep raises, `device` names the runner in its message."""

    def __init__(self, *, alloc: Callable, write: Callable, free: Callable | None = None,
                 layers: list[int] | None = None, on_drop: Callable | None = None,
                 error: Callable[[str], Exception] = KineticError, device: str = "the device"):
        self.alloc, self.write, self.free, self.layers = alloc, write, free, layers
        self.on_drop, self.error, self.device = on_drop, error, device
        self.by_cache: dict[int, KVMirror] = {}

    def mirror(self, cache: SequenceKV) -> KVMirror:
        """The device copy of `cache`, made on first use and brought up to date with the rows the
        host wrote since its last pass. The copies of caches that no longer exist are dropped here."""
        for key, m in list(self.by_cache.items()):
            if m.cache() is None or (key == id(cache) and m.cache() is not cache):
                self._drop(key)
        m = self.by_cache.get(id(cache))
        if m is None:
            m = self.by_cache[id(cache)] = self._new(cache)
        m.sync(cache)
        return m

    def _new(self, cache: SequenceKV) -> KVMirror:
        layers = self.layers if self.layers is not None else cache.layers()
        m = KVMirror(cache, list(layers), self.write)
        try:
            for layer in layers:
                k, v = cache.storage(layer)
                if k.dtype != np.float16:
                    raise self.error(f"{self.device} keeps an f16 cache")
                m.k[layer] = self.alloc(k.nbytes)
                m.v[layer] = self.alloc(v.nbytes)
        except Exception:
            self._free(m)
            raise
        return m

    def _drop(self, key: int) -> None:
        m = self.by_cache.pop(key)
        if self.on_drop is not None:
            self.on_drop(m)
        self._free(m)

    def _free(self, m: KVMirror) -> None:
        if self.free is not None:
            for buf in [*m.k.values(), *m.v.values()]:
                self.free(buf)
        m.k, m.v = {}, {}

    def close(self) -> None:
        """Drop every copy (their buffers freed)."""
        for key in list(self.by_cache):
            self._drop(key)
