"""Reading GGUF files: metadata, the tensor table, and memory-mapped tensor data.

Owns: parsing a GGUF header safely and handing out zero-copy numpy views of tensor bytes.
Does not own: what tensors mean (families), tokenizers, dequantization (kinetic.ir.quants).

Why the header is parsed here and not by `gguf.GGUFReader`: the reader builds a Python object per
metadata element, which takes ~10 s on a 262k-token vocabulary (Gemma 3 270M), and it does not
bound-check counts, lengths or tensor extents against the file, so a hostile file can make it
allocate without limit or loop for hours. This parser reads the same format (the `gguf` package's
constants name the value and tensor types), checks every count, length and extent against the bytes
that are actually there before touching them, keeps large arrays undecoded until asked for, and
maps the file once with numpy. Every failure is a KineticError naming the problem.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from kinetic.errors import KineticError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_KEY_BYTES = 65_536

_SCALAR = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_NUMPY = {t: np.dtype(fmt) for t, fmt in _SCALAR.items()}
_NUMPY[GGUFValueType.BOOL] = np.dtype(np.uint8)

_FIX_HINT = "The file is damaged or not a GGUF model; download it again or check its source."


def _bad(path: Path, what: str) -> KineticError:
    return KineticError(f"{path.name} is not a valid GGUF file: {what}", _FIX_HINT)


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


@dataclass(frozen=True)
class LazyArray:
    """A metadata array left undecoded: its element type, length and where its bytes start."""

    item_type: GGUFValueType
    count: int
    offset: int


class Metadata(Mapping[str, Any]):
    """The key/value metadata; arrays decode on first access (numbers as numpy, strings as a list)."""

    def __init__(self, owner: GGUFFile, raw: dict[str, Any]):
        self._owner = owner
        self._raw = raw
        self._decoded: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        value = self._raw[key]
        if not isinstance(value, LazyArray):
            return value
        if key not in self._decoded:
            self._decoded[key] = self._owner._decode_array(value)
        return self._decoded[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def array_length(self, key: str) -> int | None:
        """Length of an array value without decoding it; None when the key is absent or not an array."""
        value = self._raw.get(key)
        if isinstance(value, LazyArray):
            return value.count
        return None

    def value_type(self, key: str) -> GGUFValueType | None:
        value = self._raw.get(key)
        if isinstance(value, LazyArray):
            return GGUFValueType.ARRAY
        return None if key not in self._raw else _python_type(value)


def _python_type(value: Any) -> GGUFValueType:
    if isinstance(value, bool):
        return GGUFValueType.BOOL
    if isinstance(value, int):
        return GGUFValueType.INT64
    if isinstance(value, float):
        return GGUFValueType.FLOAT64
    return GGUFValueType.STRING


class _Cursor:
    """Reads little-endian values from a byte buffer, refusing to read past its end."""

    def __init__(self, path: Path, buf: memoryview, pos: int = 0):
        self.path = path
        self.buf = buf
        self.pos = pos

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise _bad(self.path, f"{what} runs past the end of the file (at byte {self.pos})")

    def scalar(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self, what: str, limit: int | None = None) -> str:
        n = self.scalar("<Q", what)
        if limit is not None and n > limit:
            raise _bad(self.path, f"{what} is {n} bytes long (at most {limit} allowed)")
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")


class GGUFFile:
    """An open GGUF file: `metadata`, `tensors` (name -> TensorInfo, in file order) and their bytes."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            size = self.path.stat().st_size
            if size == 0:
                raise _bad(self.path, "the file is empty")
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        except KineticError:
            raise
        except OSError as exc:
            raise KineticError(f"cannot read {self.path}: {exc.strerror or exc}", "Check the path.") from exc
        self.file_size = size
        self._buf = memoryview(self._map)
        self._parse()

    # -- parsing -----------------------------------------------------------------------------------

    def _parse(self) -> None:
        cur = _Cursor(self.path, self._buf)
        cur.need(4, "the magic number")
        magic = bytes(self._buf[:4])
        if magic != GGUF_MAGIC:
            raise _bad(self.path, f"it starts with {magic!r} instead of b'GGUF'")
        cur.pos = 4
        version = cur.scalar("<I", "the version")
        if version not in (2, 3):
            if version & 0xFFFF == 0 and version >> 16 in (2, 3):
                raise KineticError(
                    f"{self.path.name} is a big-endian GGUF file, which is not supported",
                    "Convert it to a little-endian GGUF file first.",
                )
            raise KineticError(
                f"{self.path.name} has GGUF version {version}; versions 2 and 3 are supported",
                "Convert the file with a current llama.cpp (convert_hf_to_gguf.py) and try again.",
            )
        self.version = version
        n_tensors = cur.scalar("<Q", "the tensor count")
        n_kv = cur.scalar("<Q", "the metadata count")
        # Every metadata entry takes at least 13 bytes and every tensor entry at least 28.
        if n_kv * 13 > self.file_size or n_tensors * 28 > self.file_size:
            raise _bad(self.path, f"it claims {n_tensors} tensors and {n_kv} metadata entries, "
                       "more than the file could hold")
        raw: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string("a metadata key", limit=MAX_KEY_BYTES)
            if key in raw:
                raise _bad(self.path, f"metadata key {key!r} appears twice")
            vtype = self._value_type(cur.scalar("<I", f"the type of {key}"), key)
            raw[key] = self._read_value(cur, vtype, key)
        self.metadata = Metadata(self, raw)
        split_count = raw.get("split.count", 1)
        if isinstance(split_count, int) and split_count > 1:
            raise KineticError(
                f"{self.path.name} is part {raw.get('split.no', 0) + 1} of a model split into {split_count} "
                "files; split files are not read yet",
                "Join the parts first with llama.cpp's `llama-gguf-split --merge FIRST-PART OUT.gguf`.",
            )
        infos = [self._read_tensor_info(cur) for _ in range(n_tensors)]
        alignment = raw.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise _bad(self.path, f"general.alignment is {alignment!r}, not a power of two")
        self.alignment = alignment
        self.data_offset = -(-cur.pos // alignment) * alignment
        self.tensors = self._place_tensors(infos)

    def _value_type(self, code: int, key: str) -> GGUFValueType:
        try:
            return GGUFValueType(code)
        except ValueError:
            raise _bad(self.path, f"metadata {key!r} has unknown value type {code}") from None

    def _read_value(self, cur: _Cursor, vtype: GGUFValueType, key: str) -> Any:
        if vtype == GGUFValueType.STRING:
            return cur.string(f"the value of {key}")
        if vtype == GGUFValueType.ARRAY:
            item = self._value_type(cur.scalar("<I", f"the item type of {key}"), key)
            count = cur.scalar("<Q", f"the length of {key}")
            start = cur.pos
            if item == GGUFValueType.ARRAY:
                raise _bad(self.path, f"metadata {key!r} is an array of arrays, which GGUF models do not use")
            if item == GGUFValueType.STRING:
                if count * 8 > len(self._buf) - cur.pos:
                    raise _bad(self.path, f"the array {key} claims {count} strings, more than the file holds")
                for _ in range(count):  # skip over the strings, checking each length
                    n = cur.scalar("<Q", f"a string in {key}")
                    cur.need(n, f"a string in {key}")
                    cur.pos += n
            else:
                width = _NUMPY[item].itemsize
                cur.need(count * width, f"the array {key}")
                cur.pos += count * width
            return LazyArray(item, count, start)
        value = cur.scalar(_SCALAR[vtype], f"the value of {key}")
        return bool(value) if vtype == GGUFValueType.BOOL else value

    def _decode_array(self, arr: LazyArray) -> Any:
        if arr.item_type == GGUFValueType.STRING:
            out: list[str] = []
            buf, pos = self._buf, arr.offset
            for _ in range(arr.count):
                (n,) = struct.unpack_from("<Q", buf, pos)
                pos += 8
                out.append(bytes(buf[pos : pos + n]).decode("utf-8", errors="replace"))
                pos += n
            return out
        dtype = _NUMPY[arr.item_type]
        values = np.frombuffer(self._buf, dtype=dtype, count=arr.count, offset=arr.offset)
        return values.astype(bool) if arr.item_type == GGUFValueType.BOOL else values

    def _read_tensor_info(self, cur: _Cursor) -> tuple[str, int, tuple[int, ...], int]:
        name = cur.string("a tensor name", limit=MAX_KEY_BYTES)
        n_dims = cur.scalar("<I", f"the dimension count of tensor {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise _bad(self.path, f"tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        ne = tuple(cur.scalar("<Q", f"the shape of tensor {name}") for _ in range(n_dims))
        type_code = cur.scalar("<I", f"the type of tensor {name}")
        offset = cur.scalar("<Q", f"the offset of tensor {name}")
        return name, type_code, ne, offset

    def _place_tensors(self, infos) -> dict[str, TensorInfo]:
        tensors: dict[str, TensorInfo] = {}
        data_size = self.file_size - self.data_offset
        for name, type_code, ne, rel in infos:
            if name in tensors:
                raise _bad(self.path, f"tensor {name} appears twice")
            try:
                qtype = GGMLQuantizationType(type_code)
                block, type_size = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise KineticError(
                    f"tensor {name} has type {type_code}, which Kinetic does not know",
                    "The file may need a newer Kinetic; check `kinetic info` for the types it uses.",
                ) from None
            n = 1
            for d in ne:
                if d <= 0:
                    raise _bad(self.path, f"tensor {name} has a dimension of {d}")
                n *= d
                if n > data_size * 8:  # no type stores more than 8 values per byte
                    raise _bad(self.path, f"tensor {name} has shape {list(ne)}, larger than the file")
            if ne[0] % block:
                raise _bad(self.path, f"tensor {name} has rows of {ne[0]} values, not a multiple of "
                           f"{qtype.name}'s block of {block}")
            nbytes = n // block * type_size
            if rel % self.alignment:
                raise _bad(self.path, f"tensor {name} starts at {rel}, not aligned to {self.alignment}")
            if rel + nbytes > data_size:
                raise _bad(self.path, f"tensor {name} ends past the end of the file "
                           f"(needs {self.data_offset + rel + nbytes} bytes, the file has {self.file_size})")
            tensors[name] = TensorInfo(name, qtype, ne, self.data_offset + rel, nbytes)
        self._check_overlaps(tensors)
        return tensors

    def _check_overlaps(self, tensors: dict[str, TensorInfo]) -> None:
        ordered = sorted(tensors.values(), key=lambda t: t.offset)
        for a, b in zip(ordered, ordered[1:]):
            if a.offset + a.nbytes > b.offset:
                raise _bad(self.path, f"tensors {a.name} and {b.name} overlap")

    # -- access ------------------------------------------------------------------------------------

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise _bad(self.path, "general.architecture is missing")
        return arch

    def arch_key(self, suffix: str, default: Any = None) -> Any:
        """The value of `<architecture>.<suffix>`, e.g. arch_key("block_count")."""
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the mapped file (no copy)."""
        t = self.tensors[name]
        return self._map[t.offset : t.offset + t.nbytes]

    def array(self, name: str) -> np.ndarray:
        """F32/F16/BF16 tensors as typed views in numpy order; quantized ones as [rows..., row_bytes] uint8."""
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


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open and validate a GGUF file; every problem is a KineticError naming it."""
    return GGUFFile(path)
