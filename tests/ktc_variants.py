"""Editing .ktc files as an attacker would: change sections, then write the file again with valid hashes.

Owns: `read_sections(path)` (each section's bytes) and `rewrite(sections, edits, dst)`, which writes the
sections with some replaced through kinetic's own writer, so every hash and the manifest are right
and only what a section says is wrong. Unsigned: an edit cannot keep a signature.
"""

from __future__ import annotations

from pathlib import Path

from kinetic.ktc import Kind, KtcFile
from kinetic.ktc.writer import SectionData, write_ktc


def read_sections(path: Path) -> dict[Kind, bytes]:
    ktc = KtcFile.open(path)
    return {kind: bytes(ktc.section(kind)) for kind in ktc.entries}


def rewrite(source: dict[Kind, bytes], edits: dict[Kind, bytes], dst: Path) -> Path:
    parts = [SectionData(kind, [edits.get(kind, data)]) for kind, data in source.items()]
    write_ktc(dst, parts, overwrite=True)
    return dst
