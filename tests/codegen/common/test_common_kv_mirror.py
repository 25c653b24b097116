"""A device's copy of a sequence's cache (kinetic/codegen/common/kv_mirror.py) follows the runtime's
KVCache through the host_writes protocol: what the host wrote itself is copied up, nothing else; the
copies live in one pool, a slot per live cache, which grows when more caches live at once."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from kinetic.codegen.common.kv_mirror import KVMirrors
from kinetic.errors import KineticError
from kinetic.runtime.kv_cache import KVCache

WIDTH = {0: 4, 1: 4}


class FakeDevice:
    """Buffers are numpy byte arrays; every copy up and every free is logged."""

    def __init__(self):
        self.writes: list[tuple[int, int]] = []  # (byte offset, bytes) per copy
        self.freed = 0

    def alloc(self, nbytes: int) -> np.ndarray:
        return np.zeros(nbytes, np.uint8)

    def write(self, buf: np.ndarray, at: int, rows: np.ndarray) -> None:
        raw = np.ascontiguousarray(rows).reshape(-1).view(np.uint8)
        buf[at : at + raw.nbytes] = raw
        self.writes.append((at, raw.nbytes))

    def free(self, buf) -> None:
        self.freed += 1


def mirrors(fake: FakeDevice, **kw) -> KVMirrors:
    return KVMirrors(alloc=fake.alloc, write=fake.write, free=fake.free, **kw)


def rows(n: int, start: float) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    values = (start + np.arange(n * 4, dtype=np.float16).reshape(n, 4)).astype(np.float16)
    return {layer: (values, -values) for layer in WIDTH}


def device_rows(kv: KVMirrors, m, layer: int, n: int, which: str = "k") -> np.ndarray:
    """The first n rows of m's cache in the pool's keys (or values) of a layer."""
    pool = kv.k if which == "k" else kv.v
    return pool[layer][m.base * 8 : (m.base + n) * 8].view(np.float16).reshape(n, 4)


def test_the_first_pass_copies_every_committed_row_then_only_what_the_host_wrote():
    """First use copies rows [0, length); a pass the device computed in place (commit_written) copies
    nothing; one host commit copies from its first slot; a kept draft row moved down copies from the
    slot it moved to; a rollback copies nothing."""
    device, cache = FakeDevice(), KVCache(WIDTH, 16)
    cache.commit(rows(3, 0), np.arange(3), np.arange(3, dtype=np.int32))
    kv = mirrors(device)
    m = kv.mirror(cache)
    assert len(device.writes) == 4 and np.array_equal(device_rows(kv, m, 0, 3), cache.k[0][:3])
    device.writes.clear()
    computed = rows(1, 50)  # a pass on the device: its rows stored there, then copied back in place
    for layer, (k, v) in computed.items():
        kv.k[layer][3 * 8 : 4 * 8], kv.v[layer][3 * 8 : 4 * 8] = k.view(np.uint8)[0], v.view(np.uint8)[0]
    cache.write_pass_rows(computed)
    cache.commit_written(np.array([3], np.int32))
    assert kv.mirror(cache) is m and device.writes == []
    cache.commit(rows(2, 100), np.arange(2), np.array([4, 5], np.int32))
    kv.mirror(cache)
    assert device.writes and all(at == 4 * 8 for at, _ in device.writes)  # slots 4.. of each layer
    assert np.array_equal(device_rows(kv, m, 1, 6), cache.k[1][:6])
    device.writes.clear()
    cache.keep_written(np.array([1]), np.array([6], np.int32))  # row 1 of a tree moves down to slot 6
    kv.mirror(cache)
    assert device.writes and all(at == 6 * 8 for at, _ in device.writes)
    device.writes.clear()
    cache.truncate(2)
    kv.mirror(cache)
    assert device.writes == []


def test_two_host_writes_since_the_last_pass_copy_everything():
    """With more than one host write since the last pass, only the latest's first slot is known:
    every committed row goes up again."""
    device, cache = FakeDevice(), KVCache(WIDTH, 16)
    kv = mirrors(device)
    kv.mirror(cache)
    cache.commit(rows(2, 0), np.arange(2), np.arange(2, dtype=np.int32))
    cache.commit(rows(1, 9), np.arange(1), np.array([2], np.int32))
    device.writes.clear()
    kv.mirror(cache)
    assert {at for at, _ in device.writes} == {0}


def test_a_dead_cache_frees_its_slot_and_only_the_runners_layers_are_kept():
    """A copy lives as long as its cache: its slot is free again at the next pass after the cache is
    gone (the next cache takes it, the pool keeps its buffers); `layers` limits the pool to the
    runner's layers."""
    device = FakeDevice()
    kv = mirrors(device, layers=[1])
    cache = KVCache(WIDTH, 8)
    first = kv.mirror(cache)
    assert sorted(kv.k) == sorted(kv.v) == [1] and first.slot == 0
    del cache
    gc.collect()
    other = KVCache(WIDTH, 8)
    second = kv.mirror(other)
    assert second is not first and second.slot == 0 and kv.capacity == 1 and device.freed == 0
    assert list(kv.by_cache) == [id(other)]
    kv.close()
    assert kv.by_cache == {} and device.freed == 2


def test_a_cache_the_device_cannot_keep_is_refused():
    """A device keeps f16 caches only: an f32 one is refused with the device's name, nothing kept."""
    kv = mirrors(FakeDevice(), device="the test runner")
    with pytest.raises(KineticError, match="the test runner keeps an f16 cache"):
        kv.mirror(KVCache(WIDTH, 8, np.float32))
    assert kv.by_cache == {}


def test_the_pool_grows_and_copies_every_live_cache_up_again():
    """Two caches alive at once: the pool gets buffers for two (the old ones freed, on_grow told),
    each cache its own slot, and both copies hold their cache's committed rows after the next pass
    (the first one copied up again from the host)."""
    device, grown = FakeDevice(), []
    kv = mirrors(device, on_grow=lambda: grown.append(kv.capacity))
    a, b = KVCache(WIDTH, 8), KVCache(WIDTH, 8)
    a.commit(rows(3, 0), np.arange(3), np.arange(3, dtype=np.int32))
    b.commit(rows(2, 40), np.arange(2), np.arange(2, dtype=np.int32))
    kv.mirror(a)
    ma, mb = kv.mirror_all([a, b])
    assert grown == [1, 2] and device.freed == 4 and (ma.slot, mb.slot) == (0, 1) and mb.base == 8
    for layer in WIDTH:
        assert np.array_equal(device_rows(kv, ma, layer, 3), a.k[layer][:3])
        assert np.array_equal(device_rows(kv, mb, layer, 2, "v"), b.v[layer][:2])


def test_a_pool_over_the_binding_limit_is_refused():
    """A pool buffer larger than the device allows (max_buffer_bytes) is a KineticError saying how
    many caches fit, before anything is freed or allocated."""
    device = FakeDevice()
    kv = mirrors(device, max_buffer_bytes=2 * 8 * 8, device="the test runner")  # two caches of 8 rows
    first = KVCache(WIDTH, 8)
    kv.mirror_all([first, KVCache(WIDTH, 8)])
    with pytest.raises(KineticError, match="at most 2 sequences"):
        kv.mirror_all([first, KVCache(WIDTH, 8), KVCache(WIDTH, 8)])
    assert kv.capacity == 2 and device.freed == 0


def test_a_pool_the_device_has_no_memory_for_is_refused():
    """An allocation that runs out of device memory while the pool grows is a KineticError naming
    the caches asked for (not the device library's own error), and the pool holds nothing after."""
    device = FakeDevice()

    def alloc(nbytes: int):
        raise MemoryError("out of device memory")

    kv = KVMirrors(alloc=alloc, write=device.write, device="the test runner")
    with pytest.raises(KineticError, match="caches of 1 sequences of 8 entries do not fit"):
        kv.mirror(KVCache(WIDTH, 8))
    assert kv.capacity == 0 and kv.k == {}
