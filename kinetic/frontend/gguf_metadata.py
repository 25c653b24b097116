"""The key/value section of a GGUF header: a bounded byte cursor, the metadata entries, lazy arrays.

Owns: reading little-endian values without ever reading past the bytes present (`Cursor`), the
metadata entries (`read_metadata`), arrays kept undecoded until asked for (`LazyArray`) and the
`Metadata` mapping that decodes them on first access; the one-line KineticError every header
problem becomes (`bad_file`).
Does not own: the preamble, the tensor table or tensor data (kinetic.frontend.gguf_file), what any
key means (kinetic.frontend.hparams, the tokenizer, families).

Every count and length is checked against the bytes left before anything is read or allocated for
it, so work is linear in the bytes present (see kinetic.frontend.gguf_file for the guarantees).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType

from kinetic.errors import KineticError

MAX_KEY_BYTES = 65_536

_SCALAR = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<B",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_NUMPY = {t: np.dtype(fmt) for t, fmt in _SCALAR.items()}
_U64 = struct.Struct("<Q")

_FIX_HINT = "The file is damaged or not a GGUF model; download it again or check its source."


def bad_file(path: Path, what: str) -> KineticError:
    """The error for a malformed header: the file's name, what is wrong, and what to do."""
    return KineticError(f"{path.name} is not a valid GGUF file: {what}", _FIX_HINT)


@dataclass(frozen=True)
class LazyArray:
    """A metadata array left undecoded: its element type, length and where its bytes start."""

    item_type: GGUFValueType
    count: int
    offset: int


class Cursor:
    """Reads little-endian values from a byte buffer, refusing to read past its end."""

    def __init__(self, path: Path, buf: memoryview, pos: int = 0):
        self.path = path
        self.buf = buf
        self.pos = pos

    @property
    def left(self) -> int:
        return len(self.buf) - self.pos

    def need(self, n: int, what: str) -> None:
        if n < 0 or n > self.left:
            raise bad_file(self.path, f"{what} runs past the end of the file (at byte {self.pos})")

    def scalar(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self, what: str, limit: int | None = None) -> str:
        start = self.pos
        n = self.scalar("<Q", what)
        if limit is not None and n > limit:
            raise bad_file(self.path, f"{what} at byte {start} is {n} bytes long (at most {limit} allowed)")
        self.need(n, what)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise bad_file(self.path, f"{what} at byte {start} is not valid UTF-8") from None


class Metadata(Mapping[str, Any]):
    """The key/value metadata; arrays decode on first access (numbers as numpy, strings as a list)."""

    def __init__(self, path: Path, buf: memoryview, raw: dict[str, Any]):
        self._path = path
        self._buf = buf
        self._raw = raw
        self._decoded: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        value = self._raw[key]
        if not isinstance(value, LazyArray):
            return value
        if key not in self._decoded:
            self._decoded[key] = _decode_array(self._path, self._buf, key, value)
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

    def array_item_type(self, key: str) -> GGUFValueType | None:
        """The element type of an array value; None when the key is absent or not an array."""
        value = self._raw.get(key)
        return value.item_type if isinstance(value, LazyArray) else None

    def array_item(self, key: str, index: int) -> Any:
        """One element of an array without decoding the rest (for a token's text, say).

        Raises KeyError when the key is absent and IndexError when the index is out of range.
        """
        value = self._raw[key]
        if not isinstance(value, LazyArray):
            raise KeyError(f"metadata {key!r} is not an array")
        if not 0 <= index < value.count:
            raise IndexError(f"metadata {key!r} has {value.count} items, not {index + 1}")
        if key in self._decoded:
            return self._decoded[key][index]
        return _array_item(self._path, self._buf, key, value, index)

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


# -- reading the entries ---------------------------------------------------------------------------


def read_metadata(cur: Cursor, n_kv: int) -> dict[str, Any]:
    """The n_kv entries at the cursor: scalars and strings decoded, arrays as LazyArray."""
    raw: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string("a metadata key", limit=MAX_KEY_BYTES)
        if key in raw:
            raise bad_file(cur.path, f"metadata key {key!r} appears twice")
        vtype = _value_type(cur, cur.scalar("<I", f"the type of {key}"), key)
        raw[key] = _read_value(cur, vtype, key)
    return raw


def _value_type(cur: Cursor, code: int, key: str) -> GGUFValueType:
    try:
        return GGUFValueType(code)
    except ValueError:
        raise bad_file(cur.path, f"metadata {key!r} has unknown value type {code}") from None


def _read_value(cur: Cursor, vtype: GGUFValueType, key: str) -> Any:
    if vtype == GGUFValueType.STRING:
        return cur.string(f"the value of {key}")
    if vtype == GGUFValueType.ARRAY:
        return _read_array(cur, key)
    value = cur.scalar(_SCALAR[vtype], f"the value of {key}")
    return bool(value) if vtype == GGUFValueType.BOOL else value


def _read_array(cur: Cursor, key: str) -> LazyArray:
    item = _value_type(cur, cur.scalar("<I", f"the item type of {key}"), key)
    count = cur.scalar("<Q", f"the length of {key}")
    start = cur.pos
    if item == GGUFValueType.ARRAY:
        raise bad_file(cur.path, f"metadata {key!r} is an array of arrays, which GGUF models do not use")
    if item == GGUFValueType.STRING:
        if count > cur.left // 8:
            raise bad_file(cur.path, f"the array {key} claims {count} strings, more than the file holds")
        cur.pos = _skip_strings(cur, key, start, count)
    else:
        if count > cur.left // _NUMPY[item].itemsize:
            raise bad_file(cur.path, f"the array {key} claims {count} values, more than the file holds")
        cur.pos += count * _NUMPY[item].itemsize
    return LazyArray(item, count, start)


def _skip_strings(cur: Cursor, key: str, pos: int, count: int) -> int:
    """The position after `count` length-prefixed strings starting at pos, each checked to fit."""
    buf, end, unpack = cur.buf, len(cur.buf), _U64.unpack_from
    index = 0
    while index < count and pos + 8 <= end:
        pos += 8 + unpack(buf, pos)[0]
        if pos > end:
            break
        index += 1
    if index == count:
        return pos
    raise bad_file(cur.path, f"string {index} of the array {key} runs past the end of the file")


# -- decoding arrays on demand ---------------------------------------------------------------------


def _decode_array(path: Path, buf: memoryview, key: str, arr: LazyArray) -> Any:
    if arr.item_type != GGUFValueType.STRING:
        dtype = _NUMPY[arr.item_type]
        values = np.frombuffer(buf, dtype=dtype, count=arr.count, offset=arr.offset)
        return values.astype(bool) if arr.item_type == GGUFValueType.BOOL else values
    out: list[str] = []
    pos, unpack = arr.offset, _U64.unpack_from
    try:
        for _ in range(arr.count):  # lengths were checked when the header was parsed
            (n,) = unpack(buf, pos)
            out.append(str(buf[pos + 8 : pos + 8 + n], "utf-8"))
            pos += 8 + n
    except UnicodeDecodeError:
        raise _bad_item(path, key, len(out)) from None
    return out


def _array_item(path: Path, buf: memoryview, key: str, arr: LazyArray, index: int) -> Any:
    if arr.item_type != GGUFValueType.STRING:
        dtype = _NUMPY[arr.item_type]
        offset = arr.offset + index * dtype.itemsize
        value = np.frombuffer(buf, dtype=dtype, count=1, offset=offset)[0]
        return bool(value) if arr.item_type == GGUFValueType.BOOL else value.item()
    pos, unpack = arr.offset, _U64.unpack_from
    for _ in range(index):
        pos += 8 + unpack(buf, pos)[0]
    (n,) = unpack(buf, pos)
    try:
        return str(buf[pos + 8 : pos + 8 + n], "utf-8")
    except UnicodeDecodeError:
        raise _bad_item(path, key, index) from None


def _bad_item(path: Path, key: str, index: int) -> KineticError:
    return bad_file(path, f"string {index} of the array {key} is not valid UTF-8")
