"""Warm Start's disk tier: states kept as files under the cache directory, across restarts and shared
by every process that uses the same directory.

Owns: writing state files in the background and atomically, reading them (checked by
warm_file.decode), the size bound (least recently used out first) and turning itself off when the
disk cannot be written. Does not own what a state is or how its key is made (kinetic/runtime/warm.py: the memory
tier, keys from everything a state depends on, when restoring is worth it), nor the file format
(kinetic/runtime/warm_file.py), nor the command-line and server options that choose the directory.

A state is one file, `<key>.kwarm`, in the format of kinetic/runtime/warm_file.py. A file that is
not to be trusted (warm_file.decode says why) is never used: `get` removes it and answers None.
`put` replaces what a key held before, and keeps at most MAX_PENDING_BYTES queued (beyond, a put is
dropped: it is a cache).

Processes sharing a directory: each writes into a temporary file of a unique name in the directory,
syncs it and renames it over `<key>.kwarm`, so a reader sees a whole file or none. Eviction (oldest
modification time first; `get` touches the file it reads) tolerates files vanishing under it and
removes the temporary files of writers that died (older than STALE_TEMP_SECONDS). The bound counts
every state file and live temporary file in the directory, whoever wrote it; a process makes room
before it writes, so several processes writing at once exceed it by at most their files in flight.

Failure: any error writing (a full disk, a read-only or vanished directory) turns the tier off for
the rest of the run with one warning; `put` then does nothing and `get` answers None. Nothing here
raises to the caller but its own bugs: a malformed key, an array that is not numbers. Writes still
queued when the process exits normally are finished first (an exit hook); a process ended by a signal's
default action (SIGTERM, SIGKILL) loses them and leaves a temporary file. A read is one `read` of
the file; the arrays are read-only views of those bytes.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import re
import secrets
import threading
import time
import weakref
from pathlib import Path

import numpy as np

from kinetic.errors import KineticError
from kinetic.runtime.warm_file import BadStateFile, check_key, decode, encode
from kinetic.user_cache import cache_dir

log = logging.getLogger("kinetic.runtime")

SUFFIX = ".kwarm"
DEFAULT_LIMIT_BYTES = 2 << 30
STALE_TEMP_SECONDS = 600  # a temporary file this old belongs to a writer that died
MAX_PENDING_BYTES = 256 << 20  # puts beyond this while others wait for the writer are dropped (a cache)

_STATE_NAME = re.compile(r"[0-9a-f]{1,128}\.kwarm")
_TEMP_NAME = re.compile(r"\.[0-9a-f]{1,128}\.\d+\.[0-9a-f]{8}\.tmp")


def default_directory() -> Path:
    """$KINETIC_WARM_DIR when set (as llama.cpp's LLAMA_CACHE; the test suite points it at a temporary
    folder), else `kinetic/warm` under the user's cache folder (kinetic/user_cache.py); not created here."""
    chosen = os.environ.get("KINETIC_WARM_DIR")
    return Path(chosen) if chosen else cache_dir("warm")


def _write_file(path: Path, image) -> None:
    """Create `path` (it must not exist), write `image` and sync it to the disk."""
    with open(path, "xb") as file:
        file.write(image)
        file.flush()
        os.fsync(file.fileno())


class DiskTier:
    """States as files in `directory`, at most `limit_bytes` of them; see the module's docstring."""

    def __init__(self, directory: Path, limit_bytes: int = DEFAULT_LIMIT_BYTES):
        if not isinstance(limit_bytes, int) or limit_bytes <= 0:
            raise KineticError(f"the warm-start disk limit must be a positive number of bytes, not {limit_bytes!r}")
        self.directory = Path(directory)
        self.limit_bytes = limit_bytes
        self.enabled = True
        self.stats = {"written": 0, "hits": 0, "misses": 0, "discarded": 0,
                      "evicted": 0, "dropped": 0}
        self._lock = threading.Lock()
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._pending: dict[str, bytearray] = {}  # key -> image, queued and not yet taken by the writer
        self._pending_bytes = 0
        self._in_flight: tuple[str, bytearray] | None = None  # what the writer is writing now
        self._writer: threading.Thread | None = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if not os.access(self.directory, os.W_OK | os.X_OK):
                raise PermissionError(13, "Permission denied", str(self.directory))
        except OSError as exc:
            self._disable(exc)
        self._at_exit = _close_at_exit(weakref.ref(self))
        atexit.register(self._at_exit)

    # -- the caller's side ---------------------------------------------------------------------------

    def put(self, key: str, arrays: dict[str, np.ndarray]) -> None:
        """Queue `arrays` to be written under `key` (copied now, so the caller may reuse them)."""
        check_key(key)
        if not self.enabled:
            return
        image = encode(key, arrays)
        with self._lock:
            queued = self._pending.get(key)
            waiting = self._pending_bytes - (len(queued) if queued is not None else 0)
            if len(image) > self.limit_bytes or (waiting and waiting + len(image) > MAX_PENDING_BYTES):
                self.stats["dropped"] += 1
                return
            self._pending[key] = image
            self._pending_bytes = waiting + len(image)
            if queued is None:
                self._queue.put(key)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name="kinetic-warm-disk", daemon=True)
                self._writer.start()

    def get(self, key: str) -> dict[str, np.ndarray] | None:
        """The arrays stored under `key` (read-only), or None: no such file, a file not to be trusted
        (removed), or the tier off."""
        check_key(key)
        if not self.enabled:
            return None
        with self._lock:
            image = self._pending.get(key)
            if image is None and self._in_flight is not None and self._in_flight[0] == key:
                image = self._in_flight[1]
        if image is not None:
            return decode(key, image, verify=False)
        return self._read(key)

    def flush(self) -> None:
        """Wait until every queued write is done (written, dropped or failed)."""
        if self._writer is not None:
            self._queue.join()

    def close(self) -> None:
        """Finish the queued writes and stop the writer; the tier is off afterwards."""
        self.flush()
        with self._lock:
            self.enabled = False
            writer, self._writer = self._writer, None
        if writer is not None:
            self._queue.put(None)
            writer.join()
        atexit.unregister(self._at_exit)

    def path(self, key: str) -> Path:
        return self.directory / f"{check_key(key)}{SUFFIX}"

    # -- reading -------------------------------------------------------------------------------------

    def _read(self, key: str) -> dict[str, np.ndarray] | None:
        path = self.path(key)
        try:
            with open(path, "rb", buffering=0) as file:
                identity = os.fstat(file.fileno())
                data = file.read() if identity.st_size <= self.limit_bytes else None  # never one of ours
        except OSError:  # missing, or unreadable: either way there is nothing to trust
            self._count("misses")
            return None
        try:
            if data is None:
                raise BadStateFile(f"{identity.st_size} bytes, more than the tier's bound")
            arrays = decode(key, data)
        except BadStateFile as exc:
            log.info("warm start: ignored and removed %s: %s", path, exc)
            self._remove_if_same(path, identity)
            self._count("discarded")
            return None
        try:
            _mark_used(path)
        except OSError:
            pass
        self._count("hits")
        return arrays

    @staticmethod
    def _remove_if_same(path: Path, identity: os.stat_result) -> None:
        """Remove the bad file just read, unless another process has meanwhile renamed a new one there."""
        try:
            now = os.stat(path)
            if (now.st_dev, now.st_ino) == (identity.st_dev, identity.st_ino):
                os.unlink(path)
        except OSError:
            pass

    # -- writing (the writer thread) -----------------------------------------------------------------

    def _write_loop(self) -> None:
        while (key := self._queue.get()) is not None:
            with self._lock:
                image = self._pending.pop(key, None)
                if image is not None:
                    self._pending_bytes -= len(image)
                    self._in_flight = (key, image)
            try:
                if image is not None and self.enabled:
                    self._write(key, image)
            except Exception:  # a bug must not stop the writer with writes still queued
                log.exception("warm start: writing state %s failed", key)
            finally:
                with self._lock:
                    self._in_flight = None
                self._queue.task_done()
        self._queue.task_done()

    def _write(self, key: str, image: bytearray) -> None:
        path = self.path(key)
        temporary = self.directory / f".{key}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            self._make_room(len(image))
            _write_file(temporary, image)
            _mark_used(temporary)
            os.replace(temporary, path)
            self._count("written")
        except OSError as exc:
            try:
                temporary.unlink(missing_ok=True)
            except OSError:
                pass
            self._disable(exc)

    def _make_room(self, incoming: int) -> None:
        """Remove the least recently used state files until `incoming` more bytes fit the bound."""
        states, total, now = [], 0, time.time()
        with os.scandir(self.directory) as entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # removed by another process meanwhile
                if _STATE_NAME.fullmatch(entry.name):
                    states.append((info.st_mtime_ns, entry.name, info.st_size))
                    total += info.st_size
                elif _TEMP_NAME.fullmatch(entry.name):
                    if now - info.st_mtime > STALE_TEMP_SECONDS:
                        _unlink_quietly(entry.path)
                    else:
                        total += info.st_size
        for _, name, size in sorted(states):
            if total + incoming <= self.limit_bytes:
                break
            _unlink_quietly(self.directory / name)
            total -= size
            self._count("evicted")

    # -- bookkeeping ---------------------------------------------------------------------------------

    def _count(self, what: str) -> None:
        with self._lock:
            self.stats[what] += 1

    def _disable(self, exc: OSError) -> None:
        with self._lock:
            if not self.enabled:
                return
            self.enabled = False
            self._pending.clear()
            self._pending_bytes = 0
        reason = exc.strerror or str(exc)
        log.warning("warm start: the disk tier is off for this run: %s cannot be written (%s); states are "
                    "still kept in memory. Free some space, or choose another folder with --cache-dir.",
                    self.directory, reason)


def _mark_used(path) -> None:
    """Set the modification time, which orders eviction, to now, read from the fine clock: file
    systems stamp writes from a coarse one (milliseconds), which would tie uses close together."""
    now = time.time_ns()
    os.utime(path, ns=(now, now))


def _unlink_quietly(path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass  # another process evicted it first


def _close_at_exit(tier_ref: weakref.ref):
    """An exit hook that finishes the tier's queued writes, without keeping the tier alive."""
    def close() -> None:
        tier = tier_ref()
        if tier is not None:
            tier.close()
    return close
