"""Kinetic's folder in the user cache ($XDG_CACHE_HOME/kinetic, else ~/.cache/kinetic) and the two
things every cache in it needs: a file's stamp and a best-effort atomic JSON write.

Owns: where caches live and how a cached fact about a file is keyed. Does not own what is cached
(kernels: codegen/cpu/jit.py; file hashes: receipts/hashing.py; .ktc checks: ktc/load.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """$XDG_CACHE_HOME/kinetic/<parts> (else ~/.cache/kinetic/<parts>); not created here."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base, "kinetic", *parts)


def file_stamp(path: str | os.PathLike) -> dict:
    """What must be unchanged for a cached fact about a file to count: device, inode, size,
    modification and change times. Any write changes the change time, which no user can set back,
    so a file changed in place (even with its mtime restored) no longer matches."""
    st = os.stat(path)
    return {"device": st.st_dev, "inode": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns}


def write_json(path: Path, data) -> None:
    """Replace path with data as JSON, atomically; best effort: a cache that cannot be written only
    means the work is done again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        pass
