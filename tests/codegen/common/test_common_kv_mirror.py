"""A device's copy of a sequence's cache (kinetic/codegen/common/kv_mirror.py) follows the runtime's
KVCache through the host_writes protocol: what the host wrote itself is copied up, nothing else."""

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


def device_rows(m, layer: int, n: int) -> np.ndarray:
    return m.k[layer][: n * 8].view(np.float16).reshape(n, 4)


def test_the_first_pass_copies_every_committed_row_then_only_what_the_host_wrote():
    """First use copies rows [0, length); a pass the device computed in place (commit_written) copies
    nothing; one host commit copies from its first slot; a kept draft row moved down copies from the
    slot it moved to; a rollback copies nothing."""
    device, cache = FakeDevice(), KVCache(WIDTH, 16)
    cache.commit(rows(3, 0), np.arange(3), np.arange(3, dtype=np.int32))
    kv = mirrors(device)
    m = kv.mirror(cache)
    assert len(device.writes) == 4 and np.array_equal(device_rows(m, 0, 3), cache.k[0][:3])
    device.writes.clear()
    computed = rows(1, 50)  # a pass on the device: its rows stored there, then copied back in place
    for layer, (k, v) in computed.items():
        m.k[layer][3 * 8 : 4 * 8], m.v[layer][3 * 8 : 4 * 8] = k.view(np.uint8)[0], v.view(np.uint8)[0]
    cache.write_pass_rows(computed)
    cache.commit_written(np.array([3], np.int32))
    assert kv.mirror(cache) is m and device.writes == []
    cache.commit(rows(2, 100), np.arange(2), np.array([4, 5], np.int32))
    kv.mirror(cache)
    assert device.writes and all(at == 4 * 8 for at, _ in device.writes)  # slots 4.. of each layer
    assert np.array_equal(device_rows(m, 1, 6), cache.k[1][:6])
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


def test_a_dead_cache_is_dropped_and_only_the_runners_layers_are_kept():
    """A copy lives as long as its cache: it is dropped (its buffers freed, on_drop told) at the next
    pass after the cache is gone; `layers` limits the copy to the runner's layers."""
    device, dropped = FakeDevice(), []
    kv = mirrors(device, layers=[1], on_drop=dropped.append)
    cache = KVCache(WIDTH, 8)
    first = kv.mirror(cache)
    assert sorted(first.k) == [1]
    del cache
    gc.collect()
    other = KVCache(WIDTH, 8)
    kv.mirror(other)
    assert dropped == [first] and device.freed == 2 and list(kv.by_cache) == [id(other)]
    kv.close()
    assert kv.by_cache == {} and device.freed == 4


def test_a_cache_the_device_cannot_keep_is_refused():
    """A device keeps f16 caches only: an f32 one is refused with the device's name, nothing kept."""
    kv = mirrors(FakeDevice(), device="the test runner")
    with pytest.raises(KineticError, match="the test runner keeps an f16 cache"):
        kv.mirror(KVCache(WIDTH, 8, np.float32))
    assert kv.by_cache == {}
