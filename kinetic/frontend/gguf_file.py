"""Reading GGUF files: metadata, the tensor table, and memory-mapped tensor data.

Owns: parsing a GGUF header safely (the preamble, the split refusal, the tensor table and its
placement in the file) and handing out zero-copy numpy views of tensor bytes.
Does not own: reading the metadata entries and decoding their arrays (kinetic.frontend.gguf_metadata),
what tensors mean (families), tokenizers, dequantization (kinetic.ir.quants).

Why the header is parsed here and not by `gguf.GGUFReader`: the reader builds a Python object per
metadata element, which takes ~10 s on a 262k-token vocabulary (Gemma 3 270M), and it does not
bound-check counts, lengths or tensor extents against the file, so a hostile file can make it
allocate without limit or loop for hours. This parser reads the same format (the `gguf` package's
constants name the value and tensor types), checks every count, length and extent against the bytes
that are actually there before touching them, keeps large arrays undecoded until asked for, and
maps the file once with numpy. Every failure is a KineticError naming the problem.

The guarantees, for any input file:
* every problem is a KineticError with one line naming it and a hint, never another exception;
* work is linear in the bytes actually present (a claimed count is checked against the bytes left
  before anything is read or allocated for it), so there is no hang;
* no single allocation is larger than the file: counts and lengths only ever select bytes that
  exist, and the tensor data is mapped, not read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from kinetic.errors import KineticError
from kinetic.frontend.gguf_metadata import MAX_KEY_BYTES, Cursor, LazyArray, Metadata, bad_file, read_metadata

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
# The smallest possible entries: a key (8-byte length) + type (4) + a 1-byte value; a tensor name
# (8) + n_dims (4) + one dimension (8) + type (4) + offset (8).
MIN_KV_BYTES = 13
MIN_TENSOR_INFO_BYTES = 32


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table.

    `ne` is GGUF's order (ne[0] is the row length, innermost); `shape` is numpy's (outermost first),
    so a matrix with n_out rows of n_in values has ne == (n_in, n_out) and shape == (n_out, n_in).
    `offset` is absolute in the file.
    """

    name: str
    type: GGMLQuantizationType
    ne: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.ne))

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n


class GGUFFile:
    """An open GGUF file: `metadata`, `tensors` (name -> TensorInfo, in file order) and their bytes."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.file_size, self._map = _map_file(self.path)
        self._buf = memoryview(self._map)
        self._parse()

    # -- parsing -----------------------------------------------------------------------------------

    def _parse(self) -> None:
        cur = Cursor(self.path, self._buf)
        self.version = self._read_preamble(cur)
        n_tensors = cur.scalar("<Q", "the tensor count")
        n_kv = cur.scalar("<Q", "the metadata count")
        if n_kv > cur.left // MIN_KV_BYTES or n_tensors > cur.left // MIN_TENSOR_INFO_BYTES:
            raise bad_file(self.path, f"it claims {n_tensors} tensors and {n_kv} metadata entries, "
                           "more than the file could hold")
        raw = read_metadata(cur, n_kv)
        self.metadata = Metadata(self.path, self._buf, raw)
        self._refuse_split(raw)
        infos = [self._read_tensor_info(cur) for _ in range(n_tensors)]
        self.alignment = self._alignment(raw)
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self.tensors = self._place_tensors(infos)

    def _read_preamble(self, cur: Cursor) -> int:
        cur.need(4, "the magic number")
        magic = bytes(self._buf[:4])
        if magic != GGUF_MAGIC:
            raise bad_file(self.path, f"it starts with {magic!r} instead of b'GGUF'")
        cur.pos = 4
        version = cur.scalar("<I", "the version")
        if version in (2, 3):
            return version
        if version & 0xFFFF == 0 and version >> 16 in (2, 3):
            raise KineticError(
                f"{self.path.name} is a big-endian GGUF file, which is not supported",
                "Convert it to a little-endian GGUF file first.",
            )
        raise KineticError(
            f"{self.path.name} has GGUF version {version}; versions 2 and 3 are supported",
            "Convert the file with a current llama.cpp (convert_hf_to_gguf.py) and try again.",
        )

    def _refuse_split(self, raw: dict[str, Any]) -> None:
        count = raw.get("split.count", 1)
        if not _is_int(count):
            raise bad_file(self.path, f"split.count is {_short(count)}, not a number")
        if count <= 1:
            return
        part = raw.get("split.no")
        which = f"part {part + 1} of" if _is_int(part) else "one part of"
        raise KineticError(
            f"{self.path.name} is {which} a model split into {count} files; split files are not read yet",
            "Join the parts first with llama.cpp's `llama-gguf-split --merge FIRST-PART OUT.gguf`.",
        )

    def _alignment(self, raw: dict[str, Any]) -> int:
        alignment = raw.get("general.alignment", DEFAULT_ALIGNMENT)
        if not _is_int(alignment) or alignment <= 0 or alignment & (alignment - 1):
            raise bad_file(self.path, f"general.alignment is {_short(alignment)}, not a power of two")
        return alignment

    def _read_tensor_info(self, cur: Cursor) -> tuple[str, int, tuple[int, ...], int]:
        name = cur.string("a tensor name", limit=MAX_KEY_BYTES)
        n_dims = cur.scalar("<I", f"the dimension count of tensor {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise bad_file(self.path, f"tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        ne = tuple(cur.scalar("<Q", f"the shape of tensor {name}") for _ in range(n_dims))
        type_code = cur.scalar("<I", f"the type of tensor {name}")
        offset = cur.scalar("<Q", f"the offset of tensor {name}")
        return name, type_code, ne, offset

    def _place_tensors(self, infos) -> dict[str, TensorInfo]:
        tensors: dict[str, TensorInfo] = {}
        if infos and self.data_offset > self.file_size:
            raise bad_file(self.path, f"the tensor data would start at byte {self.data_offset}, "
                           f"past the end of the file ({self.file_size} bytes)")
        for name, type_code, ne, rel in infos:
            if name in tensors:
                raise bad_file(self.path, f"tensor {name} appears twice")
            tensors[name] = self._place_tensor(name, type_code, ne, rel)
        self._check_overlaps(tensors)
        return tensors

    def _place_tensor(self, name: str, type_code: int, ne: tuple[int, ...], rel: int) -> TensorInfo:
        qtype, block, type_size = _tensor_type(name, type_code)
        data_size = self.file_size - self.data_offset
        n = 1
        for d in ne:
            if d == 0:
                raise bad_file(self.path, f"tensor {name} has a dimension of 0")
            n *= d
            if n > data_size * 8:  # no type stores more than 8 values per byte
                raise bad_file(self.path, f"tensor {name} has shape {list(ne)}, larger than the file")
        if ne[0] % block:
            raise bad_file(self.path, f"tensor {name} has rows of {ne[0]} values, not a multiple of "
                           f"{qtype.name}'s block of {block}")
        nbytes = n // block * type_size
        if rel % self.alignment:
            raise bad_file(self.path, f"tensor {name} starts at {rel}, not aligned to {self.alignment}")
        if rel + nbytes > data_size:
            raise bad_file(self.path, f"tensor {name} ends past the end of the file "
                           f"(needs {self.data_offset + rel + nbytes} bytes, the file has {self.file_size})")
        return TensorInfo(name, qtype, ne, self.data_offset + rel, nbytes)

    def _check_overlaps(self, tensors: dict[str, TensorInfo]) -> None:
        ordered = sorted(tensors.values(), key=lambda t: t.offset)
        for a, b in zip(ordered, ordered[1:], strict=False):
            if a.offset + a.nbytes > b.offset:
                raise bad_file(self.path, f"tensors {a.name} and {b.name} overlap")

    # -- access ------------------------------------------------------------------------------------

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise bad_file(self.path, "general.architecture is missing")
        return arch

    def arch_key(self, suffix: str, default: Any = None) -> Any:
        """The value of `<architecture>.<suffix>`, e.g. arch_key("block_count")."""
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the mapped file (no copy)."""
        t = self.tensors[name]
        return self._map[t.offset : t.offset + t.nbytes]

    def array(self, name: str) -> np.ndarray:
        """F32/F16/BF16 tensors as typed views in numpy order; others as [rows..., row_bytes] uint8."""
        t = self.tensors[name]
        data = self.raw(name)
        if t.type == GGMLQuantizationType.F32:
            return data.view(np.float32).reshape(t.shape)
        if t.type == GGMLQuantizationType.F16:
            return data.view(np.float16).reshape(t.shape)
        if t.type == GGMLQuantizationType.BF16:
            return data.view(np.uint16).reshape(t.shape)
        block, type_size = GGML_QUANT_SIZES[t.type]
        return data.reshape(*t.shape[:-1], t.ne[0] // block * type_size)


def _map_file(path: Path) -> tuple[int, np.ndarray]:
    """The file's size and a read-only uint8 map of it; a clear KineticError when it cannot be read."""
    try:
        if not path.is_file():
            what = "does not exist" if not path.exists() else "is not a regular file"
            raise KineticError(f"cannot read {path}: it {what}", "Check the path.")
        size = path.stat().st_size
        if size == 0:
            raise bad_file(path, "the file is empty")
        return size, np.memmap(path, dtype=np.uint8, mode="r")
    except OSError as exc:
        raise KineticError(f"cannot read {path}: {exc.strerror or exc}", "Check the path.") from exc


def _tensor_type(name: str, type_code: int) -> tuple[GGMLQuantizationType, int, int]:
    try:
        qtype = GGMLQuantizationType(type_code)
        block, type_size = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise KineticError(
            f"tensor {name} has type {type_code}, which Kinetic does not know",
            "The file may need a newer Kinetic; check `kinetic info` for the types it uses.",
        ) from None
    return qtype, block, type_size


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, LazyArray) else "an array"
    return text if len(text) <= 40 else text[:37] + "..."


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open and validate a GGUF file; every problem is a KineticError naming it."""
    return GGUFFile(path)
