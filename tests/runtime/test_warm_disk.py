"""Warm Start's disk tier (kinetic/runtime/warm_disk.py): files round-trip, bad files are never trusted,
the size bound holds, a disk that cannot be written turns the tier off quietly, processes sharing a
folder never see a broken file, and keys cannot name paths."""

from __future__ import annotations

import errno
import logging
import multiprocessing
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from kinetic.errors import KineticError
from kinetic.runtime import warm_disk, warm_file
from kinetic.runtime.warm_disk import DiskTier
from kinetic.runtime.warm_file import encode


def sample_state(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "k": rng.standard_normal((2, 5, 8)).astype(np.float16),
        "v": rng.standard_normal((3, 7)).astype(np.float32),
        "tokens": rng.integers(-2**31, 2**31 - 1, size=11, dtype=np.int32),
        "bf16": rng.integers(0, 2**16, size=(4, 4), dtype=np.uint16),  # bf16 rows, stored as their bits
        "position": np.array(42, dtype=np.int32),  # 0-d
        "empty": np.zeros((0, 3), dtype=np.float32),
    }


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def stored(tmp_path: Path, key: str = "ab12", arrays=None) -> Path:
    """A state file written through the tier; its path."""
    tier = DiskTier(tmp_path)
    tier.put(key, arrays if arrays is not None else sample_state())
    tier.close()
    return tier.path(key)


def test_round_trip_keeps_every_dtype_shape_and_bit(tmp_path):
    """A state read back by another tier on the same folder has the dtypes, shapes and bits written."""
    state = sample_state()
    stored(tmp_path, "ab12", state)
    back = DiskTier(tmp_path).get("ab12")
    assert back is not None and back.keys() == state.keys()
    for name, array in state.items():
        assert same_bits(back[name], array), name


def test_a_read_copies_no_array(tmp_path):
    """Every array read is a read-only view of the one buffer the file was read into."""
    stored(tmp_path)
    back = DiskTier(tmp_path).get("ab12")
    views = [a for a in back.values() if a.size]
    assert all(not a.flags.owndata and not a.flags.writeable for a in views)
    assert len({id(root_buffer(a)) for a in views}) == 1


def root_buffer(array: np.ndarray):
    """The object that owns an array's memory (through views and memoryviews)."""
    owner = array
    while isinstance(owner, np.ndarray):
        owner = owner.base
    return owner.obj if isinstance(owner, memoryview) else owner


def test_a_queued_state_is_readable_before_its_write_lands(tmp_path, monkeypatch):
    """`get` answers a key whose write is still queued, with the arrays given to `put`."""
    released = threading.Event()

    def slow_write(path, image):
        released.wait(10)
        write_file(path, image)

    write_file = warm_disk._write_file
    monkeypatch.setattr(warm_disk, "_write_file", slow_write)
    tier = DiskTier(tmp_path)
    state = sample_state()
    tier.put("ab12", state)
    back = tier.get("ab12")
    released.set()
    tier.close()
    assert back is not None and all(same_bits(back[n], a) for n, a in state.items())


def test_put_copies_the_arrays(tmp_path):
    """Changing an array after `put` does not change what is stored."""
    state = sample_state()
    expected = state["v"].copy()
    tier = DiskTier(tmp_path)
    tier.put("ab12", state)
    state["v"][:] = 0
    tier.close()
    assert same_bits(DiskTier(tmp_path).get("ab12")["v"], expected)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-1])


def _flip_payload_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))


def _flip_header_bit(path: Path) -> None:
    """int32 becomes uint32 in the header: still a well-formed file, only the digest tells."""
    data = path.read_bytes()
    assert b'"<i4"' in data
    path.write_bytes(data.replace(b'"<i4"', b'"<u4"', 1))


def _foreign(path: Path) -> None:
    path.write_bytes(b"GGUF" + bytes(range(256)) * 4)


def _old_version(path: Path) -> None:
    """A well-formed file of format version 0, digest recomputed: only the version gives it away."""
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 8, 0)
    data[warm_file._DIGEST_AT:warm_file._PREFIX.size] = warm_file._digest(data)
    path.write_bytes(bytes(data))


def _another_key(path: Path) -> None:
    """The whole, valid file of key cd34 put under this file's name."""
    path.write_bytes(bytes(encode("cd34", sample_state())))


@pytest.mark.parametrize("damage", [_truncate, _flip_payload_bit, _flip_header_bit, _foreign, _old_version,
                                    _another_key])
def test_a_bad_file_is_ignored_and_removed(tmp_path, damage):
    """A truncated, bit-flipped, foreign, old-format or other key's file reads as missing and is removed."""
    path = stored(tmp_path)
    damage(path)
    tier = DiskTier(tmp_path)
    assert tier.get("ab12") is None
    assert not path.exists()
    assert tier.stats["discarded"] == 1


def _total(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir())


def test_least_recently_used_states_leave_first_and_the_total_stays_bounded(tmp_path):
    """With room for three states, the total never passes the bound, and a state just read outlives
    older unread ones."""
    size = len(encode("a0", sample_state()))
    tier = DiskTier(tmp_path, limit_bytes=3 * size + size // 2)
    for i in range(3):
        tier.put(f"a{i}", sample_state(i))
        tier.flush()
    assert tier.get("a0") is not None  # a0 is now the most recently used
    for i in range(3, 5):
        tier.put(f"a{i}", sample_state(i))
        tier.flush()
        assert _total(tmp_path) <= tier.limit_bytes
    tier.close()
    assert sorted(p.stem for p in tmp_path.iterdir()) == ["a0", "a3", "a4"]


def test_a_state_larger_than_the_bound_is_not_stored(tmp_path):
    """A state that alone passes the bound is dropped, not written."""
    tier = DiskTier(tmp_path, limit_bytes=1000)
    tier.put("ab12", sample_state())
    tier.close()
    assert list(tmp_path.iterdir()) == [] and tier.stats["dropped"] == 1


def test_a_file_larger_than_the_bound_is_removed_unread(tmp_path, monkeypatch):
    """A file larger than the tier's bound is not read (no state of this tier can be that large)."""
    path = stored(tmp_path)
    monkeypatch.setattr(warm_disk, "decode", lambda *a, **k: pytest.fail("a file over the bound was read"))
    tier = DiskTier(tmp_path, limit_bytes=path.stat().st_size - 1)
    assert tier.get("ab12") is None and not path.exists()


def test_puts_waiting_beyond_the_pending_bound_are_dropped(tmp_path, monkeypatch):
    """While the writer is busy, a put that would queue more than MAX_PENDING_BYTES is dropped, but
    one state alone is always queued, however large."""
    started, released = threading.Event(), threading.Event()

    def held_write(path, image):
        started.set()
        released.wait(10)
        write_file(path, image)

    write_file = warm_disk._write_file
    monkeypatch.setattr(warm_disk, "_write_file", held_write)
    monkeypatch.setattr(warm_disk, "MAX_PENDING_BYTES", 100)
    tier = DiskTier(tmp_path)
    tier.put("a0", sample_state())
    assert started.wait(10)  # a0 is with the writer
    tier.put("a1", sample_state())  # waits alone, larger than the bound
    tier.put("a2", sample_state())  # would wait beside a1
    released.set()
    tier.close()
    assert sorted(p.stem for p in tmp_path.iterdir()) == ["a0", "a1"] and tier.stats["dropped"] == 1


def test_dead_writers_temporaries_are_removed_and_other_files_kept(tmp_path):
    """Making room removes temporary files older than STALE_TEMP_SECONDS, and nothing else it did not write."""
    stale, live, other = tmp_path / ".ab12.99.deadbeef.tmp", tmp_path / ".ab12.98.0badf00d.tmp", tmp_path / "notes.txt"
    for path in (stale, live, other):
        path.write_bytes(b"x" * 100)
    old = time.time() - warm_disk.STALE_TEMP_SECONDS - 5
    os.utime(stale, (old, old))
    os.utime(other, (old, old))
    stored(tmp_path, "cd34")
    assert not stale.exists() and live.exists() and other.exists()


def _warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "kinetic.runtime"]


def test_a_full_disk_turns_the_tier_off_with_one_warning(tmp_path, monkeypatch, caplog):
    """ENOSPC while writing: one warning, no exception, no temporary file left, and afterwards `put`
    does nothing and `get` answers None."""
    def full_disk(path, image):
        with open(path, "xb") as file:
            file.write(image[:10])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    stored(tmp_path, "cd34")
    monkeypatch.setattr(warm_disk, "_write_file", full_disk)
    tier = DiskTier(tmp_path)
    for key in ("a1", "a2", "a3"):
        tier.put(key, sample_state())
        tier.flush()
    assert not tier.enabled and len(_warnings(caplog)) == 1
    assert tier.get("cd34") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cd34.kwarm"]
    tier.close()


def _under_a_file(tmp_path: Path) -> DiskTier:
    (tmp_path / "file").write_text("")
    return DiskTier(tmp_path / "file" / "warm")


def _vanished(tmp_path: Path) -> DiskTier:
    tier = DiskTier(tmp_path / "warm")
    shutil.rmtree(tmp_path / "warm")
    return tier


def _read_only(tmp_path: Path) -> DiskTier:
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders; the other cases cover an unwritable folder")
    tmp_path.chmod(0o555)
    return DiskTier(tmp_path)


@pytest.mark.parametrize("unwritable", [_under_a_file, _vanished, _read_only])
def test_an_unwritable_folder_turns_the_tier_off_with_one_warning(tmp_path, caplog, unwritable):
    """A folder that cannot be created, vanished or is read-only: one warning and no exception."""
    try:
        tier = unwritable(tmp_path)
        for key in ("a1", "a2"):
            tier.put(key, sample_state())
            tier.flush()
        assert tier.get("a1") is None
        assert not tier.enabled and len(_warnings(caplog)) == 1
        tier.close()
    finally:
        tmp_path.chmod(0o755)


def _slow_write_file(path: Path, image) -> None:
    """A slow disk: the file is written in 16 pieces, a millisecond apart."""
    with open(path, "xb") as file:
        for piece in np.array_split(np.frombuffer(image, np.uint8), 16):
            file.write(piece)
            file.flush()
            time.sleep(0.001)


def _share_folder(folder: str, seed: int, results) -> None:
    """One of two processes: puts and gets eight keys at random over a folder with room for three."""
    warm_disk._write_file = _slow_write_file  # this process only (forked)
    rng = np.random.default_rng(seed)
    tier = DiskTier(Path(folder), limit_bytes=3 * len(encode("a0", _big_state(0))) + 100)
    wrong = 0
    for _ in range(120):
        key = int(rng.integers(8))
        tier.put(f"a{key}", _big_state(key))
        tier.flush()
        read = int(rng.integers(8))
        back = tier.get(f"a{read}")
        if back is not None and not same_bits(back["k"], _big_state(read)["k"]):
            wrong += 1
    tier.flush()
    results.put({"wrong": wrong, "enabled_to_the_end": tier.enabled, **tier.stats})
    tier.close()


def _big_state(key: int) -> dict[str, np.ndarray]:
    return {"k": np.full(256 * 1024, key, dtype=np.float32)}  # 1 MiB: long enough to catch a reader mid-write


def test_two_processes_sharing_a_folder_never_see_a_broken_file(tmp_path):
    """Two processes writing, evicting and reading the same keys at once: every read is whole and
    right, and no reader ever finds a damaged file."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    workers = [context.Process(target=_share_folder, args=(str(tmp_path), seed, results)) for seed in (1, 2)]
    for worker in workers:
        worker.start()
    reports = [results.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(10)
        assert worker.exitcode == 0
    assert all(r["enabled_to_the_end"] for r in reports)
    assert sum(r["wrong"] for r in reports) == 0
    assert sum(r["discarded"] for r in reports) == 0
    assert sum(r["hits"] for r in reports) > 0 and sum(r["evicted"] for r in reports) > 0


@pytest.mark.parametrize("key", ["../ab", "ab/cd", "..", "", "AB12", "ab 12", "a" * 129, "ab12.kwarm"])
def test_a_key_that_is_not_lowercase_hex_is_refused(tmp_path, key):
    """`put` and `get` refuse keys that could name another path, and write nothing."""
    tier = DiskTier(tmp_path / "warm")
    with pytest.raises(KineticError):
        tier.put(key, sample_state())
    with pytest.raises(KineticError):
        tier.get(key)
    tier.close()
    assert list(tmp_path.rglob("*.kwarm")) == []


def test_queued_writes_land_when_the_process_exits(tmp_path):
    """A process that exits without closing its tier still writes what it queued."""
    script = ("import numpy as np, sys; from pathlib import Path; from kinetic.runtime.warm_disk import DiskTier; "
              "DiskTier(Path(sys.argv[1])).put('ab12', {'k': np.arange(1 << 20, dtype=np.float32)})")
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=120)
    back = DiskTier(tmp_path).get("ab12")
    assert back is not None and same_bits(back["k"], np.arange(1 << 20, dtype=np.float32))

