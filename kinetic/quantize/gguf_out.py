"""The GGUF file `kinetic quantize` writes, laid out byte for byte as llama-quantize lays it out.

Owns: the metadata block (header, key/value pairs, tensor infos, padding) and the data offsets.
llama-quantize copies the input's key/value pairs in their order, then sets
general.quantization_version and general.file_type (a set removes the key and appends it, so both
end up last, in that order) and drops the split keys; tensor infos keep each tensor's shape (trailing
1s dropped, as ggml_n_dims does), take the new type, and each tensor's data is padded to 32 bytes,
the last one included. The input's key/value pairs are copied as the bytes the input holds them in
(walked over after kinetic's reader has checked the file), so no value is re-encoded.

Does not own the tensors' contents (encoders.py) or the choice of types (mixtures.py).

Hand-written rather than gguf.GGUFWriter: that writer puts general.architecture first whatever the
input's order, refuses empty arrays and re-encodes every value; llama-quantize's layout needs none of
that, only the bytes copied in order.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT; llama-quantize pads with it whatever the input says
GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
QUANTIZATION_VERSION = 2  # GGML_QNT_VERSION
KEY_QUANTIZATION_VERSION = "general.quantization_version"
KEY_FILE_TYPE = "general.file_type"
_DROPPED_KEYS = {KEY_QUANTIZATION_VERSION, KEY_FILE_TYPE, "split.no", "split.count", "split.tensors.count"}
_SCALAR_BYTES = {GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1, GGUFValueType.UINT16: 2,
                 GGUFValueType.INT16: 2, GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4,
                 GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8}


@dataclass(frozen=True)
class TensorSlot:
    """One tensor of the output: its name, ggml dims (ne[0] first), type and data offset."""

    name: str
    dims: tuple[int, ...]
    type: GGMLQuantizationType
    offset: int

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.dims, self.type)


def pad(n: int, align: int = ALIGNMENT) -> int:
    return (n + align - 1) // align * align


def tensor_nbytes(dims: tuple[int, ...], qtype: GGMLQuantizationType) -> int:
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    rows = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
    return rows * (dims[0] // block) * block_bytes


def ggml_dims(shape) -> tuple[int, ...]:
    """A tensor's dims as gguf_add_tensor writes them: trailing 1s dropped, at least one dim."""
    dims = [int(d) for d in shape]
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    return tuple(dims)


def _string(text: str) -> bytes:
    encoded = text.encode("utf-8")
    return struct.pack("<Q", len(encoded)) + encoded


def _u32_kv(key: str, value: int) -> bytes:
    return _string(key) + struct.pack("<II", GGUFValueType.UINT32, value)


def copied_kv_bytes(data: np.ndarray) -> list[bytes]:
    """The key/value pairs of a GGUF file's bytes (`data`, already checked by kinetic's reader), as
    stored and in order, less the keys llama-quantize sets or drops."""
    buf = memoryview(data)
    n_kv = struct.unpack_from("<Q", buf, 16)[0]
    pos, pairs = 24, []
    for _ in range(n_kv):
        start = pos
        key_len = struct.unpack_from("<Q", buf, pos)[0]
        key = bytes(buf[pos + 8:pos + 8 + key_len]).decode("utf-8")
        pos += 8 + key_len
        vtype = struct.unpack_from("<I", buf, pos)[0]
        pos = _skip_value(buf, pos + 4, vtype)
        if key not in _DROPPED_KEYS:
            pairs.append(bytes(buf[start:pos]))
    return pairs


def _skip_value(buf: memoryview, pos: int, vtype: int) -> int:
    """The position after one value of type vtype stored at pos."""
    if vtype == GGUFValueType.STRING:
        return pos + 8 + struct.unpack_from("<Q", buf, pos)[0]
    if vtype != GGUFValueType.ARRAY:
        return pos + _SCALAR_BYTES[GGUFValueType(vtype)]
    item_type, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if item_type != GGUFValueType.STRING:
        return pos + count * _SCALAR_BYTES[GGUFValueType(item_type)]
    unpack = struct.Struct("<Q").unpack_from
    for _ in range(count):
        pos += 8 + unpack(buf, pos)[0]
    return pos


def layout(tensors: list[tuple[str, tuple[int, ...], GGMLQuantizationType]]) -> list[TensorSlot]:
    """Each tensor's data offset, every tensor padded to ALIGNMENT."""
    slots, offset = [], 0
    for name, dims, qtype in tensors:
        slot = TensorSlot(name, dims, qtype, offset)
        slots.append(slot)
        offset += pad(slot.nbytes)
    return slots


def metadata_bytes(kv_pairs: list[bytes], file_type: int, slots: list[TensorSlot]) -> bytes:
    """Header, key/value pairs (copied ones, then quantization_version and file_type), tensor infos,
    padded to ALIGNMENT: everything before the first tensor's data."""
    kvs = [*kv_pairs, _u32_kv(KEY_QUANTIZATION_VERSION, QUANTIZATION_VERSION), _u32_kv(KEY_FILE_TYPE, file_type)]
    out = bytearray(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(slots), len(kvs)))
    for kv in kvs:
        out += kv
    for slot in slots:
        out += _string(slot.name) + struct.pack("<I", len(slot.dims))
        out += struct.pack(f"<{len(slot.dims)}Q", *slot.dims)
        out += struct.pack("<IQ", slot.type, slot.offset)
    out += bytes(pad(len(out)) - len(out))
    return bytes(out)
