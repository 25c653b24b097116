"""The three hashes a receipt records: token ids, the model file and the build.

Owns: BLAKE3 over token ids (little-endian u32), the model file's BLAKE3 with its cache
($XDG_CACHE_HOME/kinetic/hashes.json, so a large file is hashed once), and the build hash (BLAKE3
over this package's Python sources and the versions of what generates and runs its kernels).
Does not own what a receipt holds (receipt.py) or the checks (verify.py).
"""

from __future__ import annotations

import functools
import json
import os
import platform
from collections.abc import Iterable
from pathlib import Path

import blake3
import numpy as np

from kinetic.user_cache import cache_dir, file_stamp, write_json

HASH_CACHE_ENTRIES = 256  # files remembered; the least recently hashed are forgotten first
_PARALLEL_FROM = 16 * 1024 * 1024  # bytes from which hashing uses several threads (same hash)


def token_hash(ids: Iterable[int]) -> str:
    """BLAKE3 (hex) over the ids as little-endian 32-bit unsigned integers."""
    data = np.asarray(list(ids), dtype="<u4").tobytes()
    return blake3.blake3(data).hexdigest()


# -- the model file -----------------------------------------------------------------------------------


def hash_cache_path() -> Path:
    return cache_dir("hashes.json")


def _file_key(path: Path) -> tuple[str, dict]:
    """The cache key (the resolved path) and the file's stamp (user_cache.file_stamp)."""
    return str(path.resolve()), file_stamp(path)


def file_blake3(path: str | os.PathLike, *, use_cache: bool = True) -> str:
    """The file's BLAKE3 (hex), from the cache when the file is unchanged since it was hashed."""
    path = Path(path)
    key, stamp = _file_key(path)
    cache = _read_cache() if use_cache else {}
    entry = cache.get(key)
    if entry is not None and entry.get("stamp") == stamp and isinstance(entry.get("blake3"), str):
        return entry["blake3"]
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO if stamp["size"] >= _PARALLEL_FROM else 1)
    hasher.update_mmap(path)
    digest = hasher.hexdigest()
    if use_cache and _file_key(path)[1] == stamp:  # unchanged while it was hashed
        cache.pop(key, None)
        cache[key] = {"stamp": stamp, "blake3": digest}
        _write_cache(dict(list(cache.items())[-HASH_CACHE_ENTRIES:]))
    return digest


def _read_cache() -> dict:
    try:
        data = json.loads(hash_cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(cache: dict) -> None:
    write_json(hash_cache_path(), cache)


# -- the build ----------------------------------------------------------------------------------------

# Packages whose version can change the bits: llvmlite compiles the CPU kernels, numba the step's
# driver, numpy the reference interpreter and the sampler's arithmetic and random stream.
_BIT_PACKAGES = ("numpy", "llvmlite", "numba")


@functools.lru_cache(maxsize=1)
def build_hash() -> str:
    """16 hex digits of BLAKE3 over every .py file of the kinetic package (relative path, length and
    bytes, in path order), the Python version and the versions of _BIT_PACKAGES. Computed once per
    process: two installs with the same sources and the same compilers get the same build."""
    from importlib.metadata import PackageNotFoundError, version

    root = Path(__file__).resolve().parent.parent
    hasher = blake3.blake3()
    for source in sorted(root.rglob("*.py")):
        if "__pycache__" in source.parts:
            continue
        data = source.read_bytes()
        name = source.relative_to(root).as_posix().encode()
        hasher.update(len(name).to_bytes(4, "little") + name + len(data).to_bytes(8, "little"))
        hasher.update(data)
    tools = [f"python {platform.python_version()}"]
    for package in _BIT_PACKAGES:
        try:
            tools.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            tools.append(f"{package} none")
    hasher.update("\n".join(tools).encode())
    return hasher.hexdigest()[:16]
