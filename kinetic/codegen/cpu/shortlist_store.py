"""Shortlist's copies kept on disk, so a process loads a layer's copy instead of making it again.

Owns: `load_or_make(raw, k, dtype)`: the CopyRows of an output layer from the user cache
(~/.cache/kinetic/shortlist/<key>/, or $XDG_CACHE_HOME's), else made by shortlist_copy.make_copy
and stored there. The key is the SHA-256 of the layer's bytes with K, the type and FORMAT (bumped
whenever the copy or its bound changes), so a different file, layer or rule never reads a foreign
copy. Arrays are .npy files read memory-mapped; a copy is written to a temporary folder and renamed
into place, so a reader never sees half of one and two writers at worst both make it. A cache that
cannot be written or read only means the copy is made again. Does not own the copy or its bound.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import fields
from pathlib import Path

import numpy as np

from kinetic.codegen.cpu.shortlist_copy import CopyRows, make_copy
from kinetic.user_cache import cache_dir

FORMAT = "lane4-v1"


def copy_key(raw: np.ndarray, k: int, dtype: str) -> str:
    digest = hashlib.sha256(f"{FORMAT}|{dtype}|{k}|{raw.shape}".encode())
    digest.update(memoryview(np.ascontiguousarray(raw)).cast("B"))
    return digest.hexdigest()


def load_or_make(raw: np.ndarray, k: int, dtype: str, folder: Path | None = None) -> CopyRows:
    """The layer's copy: from the cache when there, else made (and stored for the next process)."""
    folder = folder or cache_dir("shortlist")
    place = folder / copy_key(raw, k, dtype)
    found = _read(place)
    if found is not None and len(found.c) == raw.shape[0]:
        return found
    copy = make_copy(raw, k, dtype)
    _write(place, copy)
    return copy


def _read(place: Path) -> CopyRows | None:
    try:
        arrays = {}
        for f in fields(CopyRows):
            path = place / f"{f.name}.npy"
            arrays[f.name] = np.load(path, mmap_mode="r") if path.exists() else None
        return CopyRows(**arrays) if arrays["rows"] is not None and arrays["c"] is not None else None
    except (OSError, ValueError):
        return None


def _write(place: Path, copy: CopyRows) -> None:
    tmp = place.with_name(f"{place.name}.{os.getpid()}.tmp")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        for f in fields(CopyRows):
            value = getattr(copy, f.name)
            if value is not None:
                np.save(tmp / f"{f.name}.npy", value)
        os.replace(tmp, place)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
