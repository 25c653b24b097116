"""Writing a .ktc file: sections hashed as they are written, an optional signature, all or nothing.

Owns: `write_ktc(path, sections, signing_key)`. The file is written through kinetic.outputs'
atomic_output: a temporary file beside the target, synced, then put in place (over an existing
file only with overwrite), so a reader never sees a partial file; any failure (a full disk
included) removes the temporary file and raises a KineticError saying what happened. The bytes
depend only on the sections and the key (Ed25519 signatures are deterministic), so compiling the
same model twice gives the same file.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import blake3

from kinetic.errors import KineticError
from kinetic.ktc import layout as L
from kinetic.ktc.layout import Entry, Kind
from kinetic.outputs import atomic_output

_CHUNK = 16 * 1024 * 1024
_ZEROS = bytes(L.ALIGN)


@dataclass(frozen=True)
class SectionData:
    """A section's bytes as a list of buffers written one after another (a mapped tensor region
    stays a view; nothing is concatenated in memory)."""

    kind: Kind
    parts: Sequence[bytes | memoryview]

    @property
    def size(self) -> int:
        return sum(memoryview(p).nbytes for p in self.parts)


def write_ktc(path: str | os.PathLike, sections: list[SectionData], signing_key=None, *,
              overwrite: bool = False) -> list[Entry]:
    """Write the file; `signing_key` is a nacl.signing.SigningKey or None. An existing file at
    `path` is replaced only with overwrite (kinetic.outputs). Returns the manifest entries."""
    path = Path(path)
    sections = sorted(sections, key=lambda s: s.kind)
    sizes = [s.size for s in sections] + ([L.SIGNATURE_BLOCK_SIZE] if signing_key is not None else [])
    offsets = L.place(sizes, len(sections))
    file_size = offsets[-1] + sizes[-1]
    _check_room(path, file_size)
    with atomic_output(path, force=overwrite, size=file_size) as f:
        entries = _write_body(f, sections, offsets)
        header = L.Header(L.VERSION, file_size, L.manifest_size(len(entries)),
                          L.FLAG_SIGNED if signing_key is not None else 0, 0)
        head = L.pack_header(header) + L.pack_manifest(entries)
        if signing_key is not None:
            signed = signing_key.sign(L.SIGNING_DOMAIN + head).signature
            _pad_to(f, offsets[-1])
            f.write(bytes(signing_key.verify_key) + signed)
        f.seek(0)
        f.write(head)
    return entries


def _write_body(f, sections: list[SectionData], offsets: list[int]) -> list[Entry]:
    f.write(bytes(L.HEADER_SIZE + L.manifest_size(len(sections))))  # filled in last
    entries = []
    for section, offset in zip(sections, offsets, strict=False):
        _pad_to(f, offset)
        hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
        for part in section.parts:
            view = memoryview(part).cast("B")
            for start in range(0, view.nbytes, _CHUNK):
                chunk = view[start : start + _CHUNK]
                hasher.update(chunk)
                f.write(chunk)
        entries.append(Entry(int(section.kind), offset, section.size, hasher.digest()))
    return entries


def _pad_to(f, offset: int) -> None:
    gap = offset - f.tell()
    assert 0 <= gap < L.ALIGN, (offset, f.tell())
    f.write(_ZEROS[:gap])


def _check_room(path: Path, needed: int) -> None:
    if not path.parent.is_dir():
        raise KineticError(f"cannot write {path}: the folder {path.parent} does not exist", "Create it first.")
    free = shutil.disk_usage(path.parent).free
    if free < needed:
        raise KineticError(f"not enough disk space for {path.name}: it needs {needed / 2**20:.1f} MiB, "
                           f"{path.parent} has {free / 2**20:.1f} MiB free", "Free some space or write elsewhere.")
