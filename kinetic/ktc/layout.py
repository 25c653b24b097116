"""The byte layout of a .ktc file, version 1 (docs/FORMAT.md is the specification).

Owns: the constants, the section kinds, packing and unpacking the header and the manifest, and where
each region goes. Does not own reading files (reader.py), writing them (writer.py) or what a
section holds (gguf_sections.py, profile.py, build.py).

    [header 64 B][manifest 40 + 64*N B][zero padding][section][zero padding][section]...[signature 96 B]

Every region after the manifest starts at a multiple of ALIGN; the gaps are zero; the file ends where
the last region ends.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

import blake3

MAGIC = b"KTC1"
VERSION = 1
HEADER_SIZE = 64
ALIGN = 65536  # one mapping unit on every OS (Windows: 64 KiB granularity; Linux/macOS pages divide it)
HASH_SIZE = 32  # BLAKE3-256
PUBLIC_KEY_SIZE, SIGNATURE_SIZE = 32, 64
SIGNATURE_BLOCK_SIZE = PUBLIC_KEY_SIZE + SIGNATURE_SIZE
FLAG_SIGNED = 1
# What an Ed25519 signature signs: this domain string, then the header, then the manifest. The
# domain keeps a signature over a .ktc from being taken for one over anything else the key signs.
SIGNING_DOMAIN = b"kinetic .ktc v1 header+manifest\x00"

_HEADER = struct.Struct("<4sIQQII")  # magic, version, file size, manifest size, flags, reserved
_MANIFEST_HEAD = struct.Struct("<II")  # section count, reserved
_ENTRY = struct.Struct("<IIQQQ32s")  # kind, reserved, offset, size, reserved, BLAKE3-256
MANIFEST_HEAD_SIZE = _MANIFEST_HEAD.size
ENTRY_SIZE = _ENTRY.size
assert _HEADER.size + HASH_SIZE == HEADER_SIZE and ENTRY_SIZE == 64


class Kind(IntEnum):
    """Section kinds, in the order they appear in a file. Each appears at most once."""

    WEIGHTS = 1  # a GGUF file: every tensor, every metadata key except tokenizer.*
    TOKENIZER = 2  # a GGUF file without tensors: the tokenizer.* keys except tokenizer.chat_template
    CHAT_TEMPLATE = 3  # UTF-8 Jinja text (absent when the model has no template)
    GRAPH = 4  # UTF-8, the optimized graph in the IR's text form
    PROFILE = 5  # UTF-8 JSON: device class, kernel variant and tuning settings
    METADATA = 6  # UTF-8 JSON: where the file came from

    @property
    def label(self) -> str:
        return self.name.lower()


REQUIRED = frozenset({Kind.WEIGHTS, Kind.TOKENIZER, Kind.GRAPH, Kind.PROFILE, Kind.METADATA})


@dataclass(frozen=True)
class Header:
    version: int
    file_size: int
    manifest_size: int
    flags: int
    reserved: int

    @property
    def signed(self) -> bool:
        return bool(self.flags & FLAG_SIGNED)


@dataclass(frozen=True)
class Entry:
    """One manifest line: a section's kind, where it lies and the BLAKE3-256 of its bytes."""

    kind: int  # a Kind's value; an int so that an unknown kind can be reported
    offset: int
    size: int
    digest: bytes
    reserved: tuple[int, int] = (0, 0)

    @property
    def end(self) -> int:
        return self.offset + self.size

    @property
    def label(self) -> str:
        return Kind(self.kind).label if self.kind in Kind._value2member_map_ else f"kind {self.kind}"


def align_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def manifest_size(n_sections: int) -> int:
    return MANIFEST_HEAD_SIZE + n_sections * ENTRY_SIZE + HASH_SIZE


def digest(data) -> bytes:
    """BLAKE3-256 of a bytes-like object (several threads for large ones; the hash is the same)."""
    view = memoryview(data)
    threads = blake3.blake3.AUTO if view.nbytes >= 16 * 1024 * 1024 else 1
    return blake3.blake3(view, max_threads=threads).digest()


def pack_header(header: Header) -> bytes:
    fields = _HEADER.pack(MAGIC, header.version, header.file_size, header.manifest_size, header.flags,
                          header.reserved)
    return fields + digest(fields)


def unpack_header(raw: bytes) -> tuple[bytes, Header, bool]:
    """(magic, header, whether the header's own BLAKE3 check matches) from its 64 bytes."""
    magic, version, file_size, msize, flags, reserved = _HEADER.unpack_from(raw)
    intact = digest(raw[: _HEADER.size]) == raw[_HEADER.size : HEADER_SIZE]
    return magic, Header(version, file_size, msize, flags, reserved), intact


def pack_manifest(entries: list[Entry]) -> bytes:
    body = _MANIFEST_HEAD.pack(len(entries), 0) + b"".join(
        _ENTRY.pack(e.kind, 0, e.offset, e.size, 0, e.digest) for e in entries)
    return body + digest(body)


def manifest_count(raw: bytes) -> tuple[int, int]:
    """(section count, reserved field) from the manifest's first 8 bytes."""
    return _MANIFEST_HEAD.unpack_from(raw)


def manifest_intact(raw: bytes) -> bool:
    return digest(raw[:-HASH_SIZE]) == raw[-HASH_SIZE:]


def unpack_entries(raw: bytes, count: int) -> list[Entry]:
    entries = []
    for i in range(count):
        kind, r1, offset, size, r2, dig = _ENTRY.unpack_from(raw, MANIFEST_HEAD_SIZE + i * ENTRY_SIZE)
        entries.append(Entry(kind, offset, size, dig, (r1, r2)))
    return entries


def place(sizes: list[int], n_sections: int | None = None) -> list[int]:
    """The offset of each region after the manifest (sections, then the signature block if any)."""
    n = len(sizes) if n_sections is None else n_sections
    offsets, pos = [], HEADER_SIZE + manifest_size(n)
    for size in sizes:
        pos = align_up(pos)
        offsets.append(pos)
        pos += size
    return offsets
