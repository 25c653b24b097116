"""A GGUF model as three .ktc sections, and back: weights, tokenizer and chat template.

Owns: splitting an open GGUF file (`split_gguf`) and joining the sections into one GGUFFile-like
view (`join_gguf`) that the frontend reads exactly as it reads the original file: the same metadata
keys, values and types, the same tensors, their bytes memory-mapped from the .ktc.

* weights: a GGUF file with every tensor and every metadata key except `tokenizer.*`. The key/value
  entries and the tensor table are the source's bytes, in the source's order; the tensor data is
  the source's data region, byte for byte, at the same offsets from its start.
* tokenizer: a GGUF file without tensors holding the `tokenizer.*` keys except the chat template.
* chat template: `tokenizer.chat_template` as UTF-8 text (no section when the file has none).

Each thing is stored once, and each section stays a GGUF file any GGUF reader can open.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGUFValueType

from kinetic.errors import KineticError
from kinetic.frontend.gguf_file import GGUF_MAGIC, GGUFFile
from kinetic.frontend.gguf_metadata import Metadata
from kinetic.ktc.layout import Kind
from kinetic.ktc.reader import KtcError, KtcFile

TEMPLATE_KEY = "tokenizer.chat_template"
_SCALAR_SIZE = {
    GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1,
    GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2,
    GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4,
    GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8,
}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_PREAMBLE = 24  # magic, version (u32), tensor count (u64), key/value count (u64)


def is_tokenizer_key(key: str) -> bool:
    return key.startswith("tokenizer.") and key != TEMPLATE_KEY


@dataclass(frozen=True)
class GGUFSections:
    weights: list[bytes | memoryview]  # header bytes, then a view of the source's tensor data
    tokenizer: bytes
    chat_template: str | None


def split_gguf(gguf: GGUFFile) -> GGUFSections:
    """The three sections of an open, already validated GGUF file."""
    buf = memoryview(np.memmap(gguf.path, dtype=np.uint8, mode="r"))  # validated by open_gguf: trusted below
    entries, tensors_start = _scan_entries(buf, len(gguf.metadata))
    tensors_end = _skip_tensor_table(buf, tensors_start, len(gguf.tensors))
    version = bytes(buf[4:8])
    model_kv = [(k, s, e) for k, s, e in entries if not k.startswith("tokenizer.")]
    tok_kv = [(k, s, e) for k, s, e in entries if is_tokenizer_key(k)]

    head = _preamble(version, len(gguf.tensors), model_kv, buf) + bytes(buf[tensors_start:tensors_end])
    head += bytes(-len(head) % gguf.alignment)
    data_end = max((t.offset + t.nbytes for t in gguf.tensors.values()), default=gguf.data_offset)
    weights = [head, buf[gguf.data_offset : data_end]] if gguf.tensors else [head]

    tokenizer = _preamble(version, 0, tok_kv, buf)
    tokenizer += bytes(-len(tokenizer) % 32)  # GGUF's default alignment, as a file without tensors ends
    template = gguf.metadata.get(TEMPLATE_KEY)
    if template is not None and not isinstance(template, str):
        raise KineticError(f"{gguf.path.name}: {TEMPLATE_KEY} is not a string", "Fix the file's chat template.")
    return GGUFSections(weights, tokenizer, template)


def _preamble(version: bytes, n_tensors: int, kv: list[tuple[str, int, int]], buf: memoryview) -> bytes:
    return (GGUF_MAGIC + version + _U64.pack(n_tensors) + _U64.pack(len(kv))
            + b"".join(bytes(buf[s:e]) for _, s, e in kv))


def _scan_entries(buf: memoryview, n_kv: int) -> tuple[list[tuple[str, int, int]], int]:
    """(key, start, end) of each key/value entry, and where the tensor table starts."""
    pos, out = _PREAMBLE, []
    for _ in range(n_kv):
        start = pos
        n = _U64.unpack_from(buf, pos)[0]
        key = str(buf[pos + 8 : pos + 8 + n], "utf-8")
        pos += 8 + n
        vtype = GGUFValueType(_U32.unpack_from(buf, pos)[0])
        pos = _skip_value(buf, pos + 4, vtype)
        out.append((key, start, pos))
    return out, pos


def _skip_value(buf: memoryview, pos: int, vtype: GGUFValueType) -> int:
    if vtype == GGUFValueType.STRING:
        return pos + 8 + _U64.unpack_from(buf, pos)[0]
    if vtype != GGUFValueType.ARRAY:
        return pos + _SCALAR_SIZE[vtype]
    item = GGUFValueType(_U32.unpack_from(buf, pos)[0])
    count = _U64.unpack_from(buf, pos + 4)[0]
    pos += 12
    if item != GGUFValueType.STRING:
        return pos + count * _SCALAR_SIZE[item]
    unpack = _U64.unpack_from
    for _ in range(count):
        pos += 8 + unpack(buf, pos)[0]
    return pos


def _skip_tensor_table(buf: memoryview, pos: int, n_tensors: int) -> int:
    for _ in range(n_tensors):
        pos += 8 + _U64.unpack_from(buf, pos)[0]  # name
        n_dims = _U32.unpack_from(buf, pos)[0]
        pos += 4 + 8 * n_dims + 4 + 8  # dims, type, offset
    return pos


# -- joining -----------------------------------------------------------------------------------------


class SectionGGUF(GGUFFile):
    """A GGUF file that is one section of a .ktc file: parsed and validated by the same code as a
    .gguf file, over the section's mapped bytes instead of a whole file.

    It sets the attributes GGUFFile.__init__ would (path, file_size, _map, _buf) and runs its parser;
    `path` is the .ktc file's, so messages name the file the user gave."""

    def __init__(self, ktc: KtcFile, kind: Kind):
        self.path = ktc.path
        self._map = ktc.section(kind)
        self.file_size = len(self._map)
        self._buf = memoryview(self._map)
        try:
            self._parse()
        except KtcError:
            raise
        except Exception as exc:  # the hash matched, so only a faulty writer gets here
            message = getattr(exc, "message", str(exc))
            raise KtcError(self.path, kind.label, f"section {kind.label} is not a valid GGUF file ({message})",
                           "The file was written by a faulty tool; compile it again from the .gguf file.") from None


class JoinedMetadata(Mapping[str, Any]):
    """The weights' and the tokenizer's metadata as one mapping, with the chat template as the
    `tokenizer.chat_template` string: what the source GGUF file's metadata held."""

    def __init__(self, weights: Metadata, tokenizer: Metadata, template: str | None):
        self._parts = (weights, tokenizer)
        self._template = template

    def _owner(self, key: str) -> Metadata | None:
        return next((p for p in self._parts if key in p), None)

    def __getitem__(self, key: str) -> Any:
        if key == TEMPLATE_KEY and self._template is not None:
            return self._template
        owner = self._owner(key)
        if owner is None:
            raise KeyError(key)
        return owner[key]

    def __iter__(self) -> Iterator[str]:
        yield from self._parts[0]
        yield from self._parts[1]
        if self._template is not None:
            yield TEMPLATE_KEY

    def __len__(self) -> int:
        return len(self._parts[0]) + len(self._parts[1]) + (self._template is not None)

    def __contains__(self, key: object) -> bool:
        return (key == TEMPLATE_KEY and self._template is not None) or any(key in p for p in self._parts)

    def array_length(self, key: str) -> int | None:
        owner = self._owner(key)
        return owner.array_length(key) if owner else None

    def array_item_type(self, key: str) -> GGUFValueType | None:
        owner = self._owner(key)
        return owner.array_item_type(key) if owner else None

    def array_item(self, key: str, index: int) -> Any:
        owner = self._owner(key)
        if owner is None:
            raise KeyError(key)
        return owner.array_item(key, index)

    def value_type(self, key: str) -> GGUFValueType | None:
        if key == TEMPLATE_KEY and self._template is not None:
            return GGUFValueType.STRING
        owner = self._owner(key)
        return owner.value_type(key) if owner else None


def join_gguf(ktc: KtcFile) -> SectionGGUF:
    """The model as the frontend reads it: the weights section with the tokenizer and chat template
    joined into its metadata. Each section must hold only its own keys."""
    weights = SectionGGUF(ktc, Kind.WEIGHTS)
    tokenizer = SectionGGUF(ktc, Kind.TOKENIZER)
    stray = next((k for k in weights.metadata if k.startswith("tokenizer.")), None)
    if stray is not None:
        raise KtcError(ktc.path, "weights", f"section weights holds the tokenizer key {stray}")
    stray = next((k for k in tokenizer.metadata if not is_tokenizer_key(k)), None)
    if stray is None and tokenizer.tensors:
        stray = f"tensor {next(iter(tokenizer.tensors))}"
    if stray is not None:
        raise KtcError(ktc.path, "tokenizer", f"section tokenizer holds {stray}, which is not a tokenizer key")
    template = ktc.text(Kind.CHAT_TEMPLATE) if ktc.has(Kind.CHAT_TEMPLATE) else None
    weights.metadata = JoinedMetadata(weights.metadata, tokenizer.metadata, template)
    return weights

