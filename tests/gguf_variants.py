"""Writing GGUF files value by value, for tests that need hostile or unusual files.

Owns: `read_entries(path)` (every metadata key with its GGUF value type, every tensor with its type,
shape and bytes, read with gguf.GGUFReader) and `write_gguf(path, kv, tensors)`, which writes
exactly what it is given: any value type for any key, arrays of any element type, tensor shapes
that do not match the hyperparameters. tests/synthetic.py's rewrite_gguf goes through
gguf.GGUFWriter, which converts values to the types it expects and so cannot write these files.
`variant()` copies a file with keys set, retyped or dropped and tensors reshaped or dropped.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType

V = GGUFValueType
ALIGNMENT = 32
_FMT = {V.UINT8: "<B", V.INT8: "<b", V.UINT16: "<H", V.INT16: "<h", V.UINT32: "<I", V.INT32: "<i",
        V.FLOAT32: "<f", V.BOOL: "<B", V.UINT64: "<Q", V.INT64: "<q", V.FLOAT64: "<d"}


@dataclass(frozen=True)
class KV:
    """One metadata entry: its type, its value (a list for arrays) and the arrays' element type."""

    type: GGUFValueType
    value: Any
    item: GGUFValueType | None = None


@dataclass(frozen=True)
class Tensor:
    name: str
    type: int  # a GGMLQuantizationType code
    ne: tuple[int, ...]  # GGUF order: ne[0] is the row length
    data: bytes


def read_entries(path: Path) -> tuple[dict[str, KV], list[Tensor]]:
    """The file's metadata and tensors (read once per path: the callers copy before changing them)."""
    kv, tensors = _read_entries(Path(path))
    return dict(kv), list(tensors)


@functools.lru_cache(maxsize=8)
def _read_entries(path: Path) -> tuple[dict[str, KV], list[Tensor]]:
    reader = GGUFReader(path)
    kv: dict[str, KV] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        vtype = field.types[0]
        item = field.types[-1] if vtype == V.ARRAY else None
        kv[key] = KV(vtype, field.contents(), item)
    tensors = [Tensor(t.name, int(t.tensor_type), tuple(int(d) for d in t.shape), bytes(np.asarray(t.data).data))
               for t in reader.tensors]
    return kv, tensors


def _string(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _value(vtype: GGUFValueType, value: Any, item: GGUFValueType | None) -> bytes:
    if vtype == V.STRING:
        return _string(value)
    if vtype == V.ARRAY:
        body = b"".join(_value(item, v, None) for v in value)
        return struct.pack("<IQ", item, len(value)) + body
    return struct.pack(_FMT[vtype], value)


def write_gguf(path: Path, kv: dict[str, KV], tensors: list[Tensor]) -> Path:
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for key, entry in kv.items():
        head += _string(key) + struct.pack("<I", entry.type) + _value(entry.type, entry.value, entry.item)
    data, offsets = b"", []
    for t in tensors:
        data += bytes(-len(data) % ALIGNMENT)
        offsets.append(len(data))
        data += t.data
    for t, offset in zip(tensors, offsets, strict=True):
        head += _string(t.name) + struct.pack(f"<I{len(t.ne)}QIQ", len(t.ne), *t.ne, t.type, offset)
    head += bytes(-len(head) % ALIGNMENT)
    path.write_bytes(head + data)
    return path


def variant(src: Path, dst: Path, *, set_kv: dict[str, KV] | None = None, drop_kv: tuple[str, ...] = (),
            shapes: dict[str, tuple[int, ...]] | None = None, types: dict[str, int] | None = None,
            drop_tensors: tuple[str, ...] = ()) -> Path:
    """src with keys set (added at the end when new) or dropped, tensors given other shapes or type
    codes (same bytes) or dropped."""
    kv, tensors = read_entries(src)
    for key in drop_kv:
        kv.pop(key, None)
    kv.update(set_kv or {})
    shapes, types = shapes or {}, types or {}
    tensors = [replace(t, ne=shapes.get(t.name, t.ne), type=int(types.get(t.name, t.type)))
               for t in tensors if t.name not in drop_tensors]
    return write_gguf(dst, kv, tensors)
