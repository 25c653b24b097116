"""Where each row of a pass reads and writes the device's cache pool (kinetic/codegen/common/
pass_caches.py): with several sequences in one pass, every row is stored in and attends over its own
cache only."""

from __future__ import annotations

import numpy as np

from kinetic.codegen.common.kv_mirror import KVMirrors
from kinetic.codegen.common.pass_caches import PassCaches
from kinetic.ir.rows import PassRows, visibility
from kinetic.runtime.kv_cache import KVCache, SequenceCaches
from tests.codegen.common.test_common_kv_mirror import WIDTH, FakeDevice, rows


def _two_sequences() -> tuple[PassRows, SequenceCaches, list[KVCache]]:
    """Sequence 0 holds 3 entries and adds a chain of 2 rows; sequence 1 holds 5 and adds one row;
    the rows interleave (0, 1, 0)."""
    a, b = KVCache(WIDTH, 16), KVCache(WIDTH, 16)
    a.commit(rows(3, 0), np.arange(3), np.arange(3, dtype=np.int32))
    b.commit(rows(5, 30), np.arange(5), np.arange(5, dtype=np.int32) + 10)
    pass_rows = PassRows(tokens=np.array([7, 8, 9], np.int32), positions=np.array([3, 15, 4], np.int32),
                         seqs=np.array([0, 1, 0], np.int32), parents=np.array([-1, -1, 0], np.int32),
                         output_rows=np.arange(3, dtype=np.int32))
    return pass_rows, SequenceCaches({0: a, 1: b}), [a, b]


def test_rows_are_stored_in_and_read_from_their_own_cache():
    """Each row's store slot is its own cache's base + length + its index among its sequence's rows,
    and its base is its own cache's first pool row; the mask gives each row exactly visibility()
    over its own cache's columns (nothing past them)."""
    pass_rows, kv, (a, b) = _two_sequences()
    caches = PassCaches.of(pass_rows, kv, KVMirrors(alloc=FakeDevice().alloc, write=FakeDevice().write))
    base_a, base_b = (m.base for m in caches.mirrors)
    assert base_a != base_b
    assert caches.base.tolist() == [base_a, base_b, base_a]
    assert caches.store.tolist() == [base_a + 3, base_b + 5, base_a + 4]
    assert caches.n_keys == 6  # sequence 1: 5 entries and its one row
    mask = caches.mask(pass_rows, window=0)
    mine_a, mine_b = np.array([0, 2]), np.array([1])
    assert np.array_equal(mask[mine_a][:, :5], visibility(pass_rows, mine_a, a.positions[:3], 0))
    assert np.array_equal(mask[mine_b], visibility(pass_rows, mine_b, b.positions[:5], 0))
    assert not mask[mine_a][:, 5:].any()


def test_write_back_puts_each_sequences_rows_into_its_own_cache():
    """A pass's new keys and values go to each sequence's cache at its slots length + k, in its
    rows' order, and nowhere else."""
    pass_rows, kv, (a, b) = _two_sequences()
    caches = PassCaches.of(pass_rows, kv, KVMirrors(alloc=FakeDevice().alloc, write=FakeDevice().write))
    new = {layer: (np.arange(12, dtype=np.float16).reshape(3, 4) + 100 * layer,
                   -np.arange(12, dtype=np.float16).reshape(3, 4)) for layer in WIDTH}
    caches.write_back(new)
    for layer, (k, v) in new.items():
        assert np.array_equal(a.k[layer][3:5], k[[0, 2]]) and np.array_equal(a.v[layer][3:5], v[[0, 2]])
        assert np.array_equal(b.k[layer][5:6], k[[1]]) and not b.k[layer][6:].any()
    assert (a.length, b.length) == (3, 5)  # written, not committed
