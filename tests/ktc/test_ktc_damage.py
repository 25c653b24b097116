""".ktc damage: a byte flipped anywhere, a file cut short, bad padding, a manifest or header that
lies; each is refused naming the part, by `kinetic verify`, by loading and by `kinetic run`.

The synthetic llama file with a chat template (tests/ktc/conftest.py), so every section kind is present.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

import kinetic
from kinetic.cli.main import main
from kinetic.errors import KineticError
from kinetic.ktc import Kind, KtcError, KtcFile
from kinetic.ktc import layout as L
from kinetic.ktc.load import LoadedKtc
from tests.ktc.helpers import assert_verify_fails, copy_of, flip, full_check

# -- one byte flipped --------------------------------------------------------------------------------


def _part_offsets(path: Path) -> dict[str, int]:
    """One byte inside each part of the file: the header, the manifest, each section, the padding."""
    ktc = KtcFile.open(path)
    offsets = {"header": 20, "manifest": L.HEADER_SIZE + 8 + 20}
    for kind, e in ktc.entries.items():
        offsets[kind.label] = e.offset + e.size // 2
    offsets["padding"] = L.HEADER_SIZE + ktc.header.manifest_size + 10
    return offsets


@pytest.mark.parametrize("part", ["header", "manifest", "weights", "tokenizer", "chat_template", "graph", "profile",
                                  "metadata", "padding"])
def test_a_flipped_byte_is_named_and_refused(part, synth_ktc, tmp_path, capsys):
    """Flipping one byte of the header, the manifest, any section or the padding makes verify exit 1
    naming that part, and makes loading (kinetic.Model, as `kinetic run` loads) refuse the file."""
    path = copy_of(synth_ktc, tmp_path / "flipped.ktc")
    flip(path, _part_offsets(path)[part])
    assert_verify_fails(path, capsys, part if part not in ("padding",) else "padding byte")
    with pytest.raises(KtcError) as info:
        kinetic.Model(path)
    assert info.value.part == part


def test_every_byte_is_covered(synth_ktc, tmp_path):
    """Flipping any byte of the file (every 4099th, plus each region's first and last) fails the full
    check: nothing in the file is outside the header, manifest, zero padding and hashed sections."""
    data = bytearray(synth_ktc.read_bytes())
    ktc = KtcFile.open(synth_ktc)
    edges = {0, L.HEADER_SIZE - 1, L.HEADER_SIZE, L.HEADER_SIZE + ktc.header.manifest_size - 1, len(data) - 1}
    for e in ktc.entries.values():
        edges |= {e.offset, e.end - 1, e.offset - 1}
    path = tmp_path / "one.ktc"
    for offset in sorted(edges | set(range(0, len(data), 4099))):
        data[offset] ^= 0x80
        path.write_bytes(data)
        data[offset] ^= 0x80
        with pytest.raises(KtcError):
            full_check(path)


def test_weights_flip_is_caught_after_a_stamp(synth_ktc, tmp_path, monkeypatch):
    """A loaded file is stamped so the next load skips hashing the weights; a byte flipped in place
    afterwards (modification time put back) still makes the next load hash them and refuse."""
    path = copy_of(synth_ktc, tmp_path / "stamped.ktc")
    LoadedKtc(path)
    hashed = []
    original = KtcFile.check_hash
    monkeypatch.setattr(KtcFile, "check_hash", lambda self, kind: hashed.append(kind) or original(self, kind))
    LoadedKtc(path)
    assert Kind.WEIGHTS not in hashed and Kind.GRAPH in hashed
    st = path.stat()
    flip(path, KtcFile.open(path).entries[Kind.WEIGHTS].offset + 100)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(KtcError) as info:
        LoadedKtc(path)
    assert info.value.part == "weights"


# -- structure: truncation, padding, manifest, header ------------------------------------------------


@pytest.mark.parametrize("keep", [10, L.HEADER_SIZE + 30, 100_000, -1])
def test_truncated_file_is_a_clear_error(keep, synth_ktc, tmp_path, capsys):
    """A file cut short anywhere is refused as truncated, never with a traceback."""
    data = synth_ktc.read_bytes()
    path = tmp_path / "cut.ktc"
    path.write_bytes(data[:keep])
    with pytest.raises(KtcError, match="truncated") as info:
        KtcFile.open(path)
    assert info.value.part == "file"
    assert_verify_fails(path, capsys, "truncated")


def test_nonzero_padding_is_refused(synth_ktc, tmp_path):
    """A padding byte set between two sections is refused naming the padding and where it is."""
    path = copy_of(synth_ktc, tmp_path / "pad.ktc")
    graph = KtcFile.open(path).entries[Kind.GRAPH]
    with open(path, "r+b") as f:
        f.seek(graph.offset - 1)
        f.write(b"\x07")
    with pytest.raises(KtcError, match=f"padding byte {graph.offset - 1} .before section graph") as info:
        KtcFile.open(path)
    assert info.value.part == "padding"


def rewrite_manifest(path: Path, change) -> None:
    """Edit the manifest entries with `change(entries) -> entries` and reseal the manifest and header
    checks, so only the structural check under test can object."""
    ktc = KtcFile.open(path)
    entries = change(list(ktc.entries.values()))
    manifest = L.pack_manifest(entries)
    header = L.Header(ktc.header.version, ktc.header.file_size, len(manifest), ktc.header.flags, 0)
    with open(path, "r+b") as f:
        f.write(L.pack_header(header) + manifest)


def test_overlapping_sections_are_refused(synth_ktc, tmp_path):
    """A section that starts inside the one before it is refused, naming both."""
    path = copy_of(synth_ktc, tmp_path / "overlap.ktc")

    def overlap(entries):
        g = next(i for i, e in enumerate(entries) if e.kind == Kind.GRAPH)
        prev = entries[g - 1]
        entries[g] = L.Entry(entries[g].kind, prev.offset + 1, entries[g].size, entries[g].digest)
        return entries

    rewrite_manifest(path, overlap)
    with pytest.raises(KtcError, match="section graph .* overlaps section chat_template") as info:
        KtcFile.open(path)
    assert info.value.part == "manifest"


def test_section_out_of_bounds_is_refused(synth_ktc, tmp_path):
    """A section that runs past the end of the file is refused, naming it."""
    path = copy_of(synth_ktc, tmp_path / "bounds.ktc")

    def grow(entries):
        e = entries[-1]
        entries[-1] = L.Entry(e.kind, e.offset, e.size + 10**9, e.digest)
        return entries

    rewrite_manifest(path, grow)
    with pytest.raises(KtcError, match="section metadata .* runs past the end of the file"):
        KtcFile.open(path)


def test_manifest_out_of_bounds_is_refused(synth_ktc, tmp_path):
    """A header whose manifest would run past the end of the file is refused, naming the manifest."""
    path = copy_of(synth_ktc, tmp_path / "manifest.ktc")
    ktc = KtcFile.open(path)
    header = L.Header(1, ktc.file_size, ktc.file_size, 0, 0)
    with open(path, "r+b") as f:
        f.write(L.pack_header(header))
    with pytest.raises(KtcError, match="manifest .* out of the file's bounds") as info:
        KtcFile.open(path)
    assert info.value.part == "manifest"


@pytest.mark.parametrize("offset, value, message", [(0, b"GGUF", "not a .ktc file"),
                                                     (4, struct.pack("<I", 2), "format version 2")])
def test_bad_magic_and_unknown_version(offset, value, message, synth_ktc, tmp_path):
    """Another file type and a later format version are refused by their header, saying which."""
    path = copy_of(synth_ktc, tmp_path / "magic.ktc")
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(value)
    with pytest.raises(KtcError, match=message) as info:
        KtcFile.open(path)
    assert info.value.part == "header"


# -- refused by the Python API and by `kinetic run` -----------------------------------------


def test_damaged_file_is_refused_by_the_python_api_as_kinetic_error(synth_ktc, tmp_path):
    """kinetic.Model raises a KineticError (the CLI's clean failure) for a damaged .ktc file."""
    path = copy_of(synth_ktc, tmp_path / "bad.ktc")
    flip(path, KtcFile.open(path).entries[Kind.TOKENIZER].offset + 5)
    with pytest.raises(KineticError, match="section tokenizer does not match"):
        kinetic.Model(path)


def test_kinetic_run_refuses_a_flipped_weights_byte(synth_ktc, tmp_path, capsys):
    """`kinetic run` on a .ktc file with one weights byte flipped exits 1 naming the weights section."""
    path = copy_of(synth_ktc, tmp_path / "run.ktc")
    assert main(["run", str(path), "--raw", "hello", "-n", "1", "--temp", "0"]) == 0
    flip(path, KtcFile.open(path).entries[Kind.WEIGHTS].offset + 4096)
    capsys.readouterr()
    assert main(["run", str(path), "--raw", "hello", "-n", "1", "--temp", "0"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "kinetic: run.ktc: section weights does not match its BLAKE3 hash in the manifest"
