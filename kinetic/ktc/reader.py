"""Reading a .ktc file: every structural check, memory-mapped sections, hashes and the signature.

Owns: `KtcFile.open(path)`, which maps the file and checks everything that costs nothing (header,
manifest, placement of every section, zero padding, the signature), and `check_hash`, which
recomputes a section's BLAKE3 (the caller decides which: loading hashes the small sections every
time and the weights unless a stamp says this very file was hashed before; `kinetic verify` hashes
all). Every failure is a KtcError naming the part of the file it is in. Does not own what the
sections mean.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kinetic.errors import KineticError
from kinetic.ktc import layout as L
from kinetic.ktc.layout import Entry, Kind

DAMAGED_HINT = "The file was changed or damaged after it was written; compile it again from the .gguf file."


class KtcError(KineticError):
    """A .ktc file that is refused; `part` names where: header, manifest, padding, signature, file,
    or a section (weights, tokenizer, chat_template, graph, profile, metadata)."""

    def __init__(self, path: Path, part: str, what: str, hint: str = DAMAGED_HINT):
        super().__init__(f"{path.name}: {what}", hint)
        self.part = part


@dataclass(frozen=True)
class Signature:
    public_key: bytes
    signature: bytes

    @property
    def public_key_hex(self) -> str:
        return self.public_key.hex()


class KtcFile:
    """An open, structurally checked .ktc file. Sections are read-only views of one mapping."""

    def __init__(self, path: Path, data: np.ndarray, header: L.Header, manifest: bytes,
                 entries: list[Entry], signature: Signature | None):
        self.path = path
        self.data = data  # uint8 [file_size], the whole file, memory-mapped
        self.header = header
        self.manifest = manifest
        self.entries = {Kind(e.kind): e for e in entries}
        self.signature = signature

    @property
    def file_size(self) -> int:
        return self.header.file_size

    @property
    def manifest_digest(self) -> bytes:
        """The manifest's own BLAKE3 check: it pins every section hash, so it names the contents."""
        return self.manifest[-L.HASH_SIZE :]

    @classmethod
    def open(cls, path: str | os.PathLike) -> KtcFile:
        path = Path(path)
        data = _map(path)
        header = _check_header(path, data)
        manifest = bytes(data[L.HEADER_SIZE : L.HEADER_SIZE + header.manifest_size])
        entries = _check_manifest(path, manifest)
        sig_offset = _check_placement(path, header, entries)
        _check_padding(path, data, header, entries, sig_offset)
        signature = _check_signature(path, data, header, manifest, sig_offset) if header.signed else None
        return cls(path, data, header, manifest, entries, signature)

    # -- sections --------------------------------------------------------------------------------

    def has(self, kind: Kind) -> bool:
        return kind in self.entries

    def section(self, kind: Kind) -> np.ndarray:
        """The section's bytes as a read-only uint8 view of the mapping (no copy)."""
        e = self.entries[kind]
        return self.data[e.offset : e.end]

    def text(self, kind: Kind) -> str:
        try:
            return bytes(self.section(kind)).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise KtcError(self.path, kind.label, f"section {kind.label} is not valid UTF-8 ({exc.reason} "
                           f"at byte {exc.start})") from None

    def json(self, kind: Kind) -> dict[str, Any]:
        try:
            value = json.loads(self.text(kind))
        except json.JSONDecodeError as exc:
            raise KtcError(self.path, kind.label, f"section {kind.label} is not valid JSON: {exc}") from None
        except (RecursionError, ValueError) as exc:  # nesting past the stack; ints past Python's digit limit
            raise KtcError(self.path, kind.label, f"section {kind.label} is JSON Kinetic does not read "
                           f"({type(exc).__name__}: {str(exc)[:80]})") from None
        if not isinstance(value, dict):
            raise KtcError(self.path, kind.label, f"section {kind.label} is not a JSON object")
        return value

    def compute_hash(self, kind: Kind) -> bytes:
        return L.digest(self.section(kind))

    def check_hash(self, kind: Kind) -> None:
        """Raise a KtcError naming the section unless its bytes have the manifest's BLAKE3."""
        if self.compute_hash(kind) != self.entries[kind].digest:
            raise KtcError(self.path, kind.label, f"section {kind.label} does not match its BLAKE3 hash in "
                           "the manifest")


def is_ktc(path: str | os.PathLike) -> bool:
    """A .ktc file by its magic, or by its name (so a damaged one is reported as a .ktc file)."""
    path = Path(path)
    if path.suffix.lower() == ".ktc":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == L.MAGIC
    except OSError:
        return False


# -- the checks, in file order -------------------------------------------------------------------


def _map(path: Path) -> np.ndarray:
    try:
        if not path.is_file():
            raise KineticError(f"cannot read {path}: it {'does not exist' if not path.exists() else 'is not a file'}",
                               "Check the path.")
        size = path.stat().st_size
        if size < L.HEADER_SIZE:
            raise KtcError(path, "file", f"the file is truncated: {size} bytes, less than the {L.HEADER_SIZE}-byte "
                           "header")
        return np.memmap(path, dtype=np.uint8, mode="r")
    except OSError as exc:
        raise KineticError(f"cannot read {path}: {exc.strerror or exc}", "Check the path.") from None


def _check_header(path: Path, data: np.ndarray) -> L.Header:
    raw = bytes(data[: L.HEADER_SIZE])
    magic, header, intact = L.unpack_header(raw)
    if magic != L.MAGIC:
        raise KtcError(path, "header", f"not a .ktc file: its header starts with {magic!r}, not {L.MAGIC!r}",
                       "A .gguf file runs as it is; `kinetic compile MODEL.gguf -o MODEL.ktc` makes a .ktc file.")
    if header.version != L.VERSION:
        raise KtcError(path, "header", f"its header says .ktc format version {header.version}; this Kinetic "
                       f"reads version {L.VERSION}", "Use a Kinetic that reads it, or compile the .gguf again.")
    if not intact:
        raise KtcError(path, "header", "the header is damaged: its BLAKE3 check does not match")
    if header.file_size > len(data):
        raise KtcError(path, "file", f"the file is truncated: its header says {header.file_size} bytes, the "
                       f"file has {len(data)}", "Copy or download the file again.")
    if header.file_size < len(data):
        raise KtcError(path, "file", f"the file has {len(data) - header.file_size} bytes after its end "
                       f"(the header says {header.file_size} bytes)")
    if header.flags & ~L.FLAG_SIGNED or header.reserved:
        raise KtcError(path, "header", f"the header has unknown flags {header.flags:#x} or a nonzero reserved field")
    end = L.HEADER_SIZE + header.manifest_size
    if header.manifest_size < L.manifest_size(0) or end > header.file_size:
        raise KtcError(path, "manifest", f"the manifest (bytes {L.HEADER_SIZE}..{end}) is out of the file's "
                       f"bounds ({header.file_size} bytes)")
    return header


def _check_manifest(path: Path, manifest: bytes) -> list[Entry]:
    count, reserved = L.manifest_count(manifest)
    if L.manifest_size(count) != len(manifest):
        raise KtcError(path, "manifest", f"the manifest is {len(manifest)} bytes but lists {count} sections "
                       f"({L.manifest_size(count)} bytes)")
    if not L.manifest_intact(manifest):
        raise KtcError(path, "manifest", "the manifest is damaged: its BLAKE3 check does not match")
    if reserved:
        raise KtcError(path, "manifest", "the manifest has a nonzero reserved field")
    entries = L.unpack_entries(manifest, count)
    previous = 0
    for e in entries:
        if e.kind not in Kind._value2member_map_:
            raise KtcError(path, "manifest", f"the manifest lists a section of unknown kind {e.kind}",
                           "The file needs a newer Kinetic.")
        if e.reserved != (0, 0):
            raise KtcError(path, "manifest", f"the manifest entry of section {e.label} has a nonzero reserved field")
        if e.kind <= previous:
            raise KtcError(path, "manifest", f"section {e.label} is listed twice or out of order")
        previous = e.kind
    missing = sorted(L.REQUIRED - {Kind(e.kind) for e in entries})
    if missing:
        raise KtcError(path, "manifest", f"the manifest has no {missing[0].label} section")
    return entries


def _check_placement(path: Path, header: L.Header, entries: list[Entry]) -> int:
    """Each section inside the file, not overlapping the one before, at the next multiple of ALIGN.
    Returns where the signature block starts (the end of the file when unsigned)."""
    end, before = L.HEADER_SIZE + header.manifest_size, "the manifest"
    for e in entries:
        if e.offset < end:
            raise KtcError(path, "manifest", f"section {e.label} (at byte {e.offset}) overlaps {before} (which "
                           f"ends at byte {end})")
        if e.offset != L.align_up(end):
            raise KtcError(path, "manifest", f"section {e.label} starts at byte {e.offset}, not at "
                           f"{L.align_up(end)}, the first multiple of {L.ALIGN} after {before}")
        if e.end > header.file_size:
            raise KtcError(path, "manifest", f"section {e.label} (bytes {e.offset}..{e.end}) runs past the end "
                           f"of the file ({header.file_size} bytes)")
        end, before = e.end, f"section {e.label}"
    if not header.signed:
        if end != header.file_size:
            raise KtcError(path, "file", f"the file has {header.file_size - end} bytes after its last section")
        return end
    sig = L.align_up(end)
    if sig + L.SIGNATURE_BLOCK_SIZE != header.file_size:
        raise KtcError(path, "signature", f"the signature block should be bytes {sig}..{sig + L.SIGNATURE_BLOCK_SIZE}"
                       f" and end the file, which has {header.file_size} bytes")
    return sig


def _check_padding(path: Path, data: np.ndarray, header: L.Header, entries: list[Entry], sig_offset: int) -> None:
    gaps, end = [], L.HEADER_SIZE + header.manifest_size
    for e in entries:
        gaps.append((end, e.offset, f"section {e.label}"))
        end = e.end
    if header.signed:
        gaps.append((end, sig_offset, "the signature"))
    for start, stop, what in gaps:
        nonzero = np.flatnonzero(data[start:stop])
        if nonzero.size:
            raise KtcError(path, "padding", f"padding byte {start + int(nonzero[0])} (before {what}) is not zero")


def _check_signature(path: Path, data: np.ndarray, header: L.Header, manifest: bytes, offset: int) -> Signature:
    from nacl.exceptions import BadSignatureError
    from nacl.signing import VerifyKey

    block = bytes(data[offset : offset + L.SIGNATURE_BLOCK_SIZE])
    sig = Signature(block[: L.PUBLIC_KEY_SIZE], block[L.PUBLIC_KEY_SIZE :])
    message = L.SIGNING_DOMAIN + bytes(data[: L.HEADER_SIZE]) + manifest
    try:
        VerifyKey(sig.public_key).verify(message, sig.signature)
    except (BadSignatureError, ValueError):
        raise KtcError(path, "signature", "the signature does not verify against the public key stored in the "
                       f"file ({sig.public_key_hex})") from None
    return sig
