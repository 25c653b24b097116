"""Warm Start's state file format: a state's arrays as one checked file image, and back.

Owns: the format (below), `encode` (arrays -> image, digest included), `decode` (image -> read-only
views of its bytes, after checking it is whole, current and written for the key asked for), and what
a key may be (`check_key`). Does not own where files live, writing them, the size bound or eviction
(kinetic/runtime/warm_disk.py: the disk tier), nor what a state holds (kinetic/runtime/warm.py).

A file, `<key>.kwarm`, is one fixed prefix, a JSON header and the arrays' bytes:

    magic b"KINWARM\\0" · format version u32 · header length u32 · file length u64 · BLAKE3 digest (32)
    header: {"key": ..., "arrays": [{"name", "dtype", "shape", "offset", "nbytes"}, ...]}
    arrays: each at a 64-byte aligned offset from the first aligned byte after the header

The digest covers every byte of the file but itself. An image that is short, long, foreign (another
magic), of another format version, written for another key or whose digest does not match is never
trusted: `decode` raises BadStateFile saying why. Hand-written rather than numpy's .npz: an .npz has
no digest over its contents, and its reads copy every array; here the arrays are read-only views of
the image's bytes (np.frombuffer).
"""

from __future__ import annotations

import json
import re
import struct

import blake3
import numpy as np

from kinetic.errors import KineticError

MAGIC = b"KINWARM\0"
FORMAT_VERSION = 1

_PREFIX = struct.Struct("<8sIIQ32s")  # magic, version, header length, file length, digest
_DIGEST_AT = _PREFIX.size - 32
_ALIGN = 64
_PARALLEL_HASH_BYTES = 8 << 20  # larger files are hashed on all cores
_KEY = re.compile(r"[0-9a-f]{1,128}")
_ARRAY_KINDS = "biuf"  # bool, signed, unsigned, float: what states are made of


def check_key(key: str) -> str:
    """The key itself, if it is 1 to 128 lowercase hex digits (file names made from it cannot leave
    the directory); otherwise a KineticError."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise KineticError(f"warm-start key {key!r} is not 1 to 128 lowercase hex digits",
                           "This is a bug in the caller: make keys with a hash's hexdigest().")
    return key


class BadStateFile(Exception):
    """A state file that is not to be trusted; the message says why."""


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _digest(image) -> bytes:
    """BLAKE3 of every byte of the file image but the digest field."""
    view = memoryview(image)
    threads = blake3.blake3.AUTO if len(view) > _PARALLEL_HASH_BYTES else 1
    hasher = blake3.blake3(max_threads=threads)
    hasher.update(view[:_DIGEST_AT])
    hasher.update(view[_PREFIX.size:])
    return hasher.digest()


def encode(key: str, arrays: dict[str, np.ndarray]) -> bytearray:
    """The file image of `arrays` under `key`, digest included (each array copied once into it)."""
    prepared, entries, end = [], [], 0
    for name, array in arrays.items():
        array = np.asarray(array)
        if array.dtype.kind not in _ARRAY_KINDS:
            raise KineticError(f"warm-start array {name!r} has dtype {array.dtype}, which is not stored",
                               "Store numbers only (bf16 as uint16).")
        array = array.astype(array.dtype.newbyteorder("<"), order="C", copy=False)
        offset = _aligned(end)
        entries.append({"name": str(name), "dtype": array.dtype.str, "shape": list(array.shape),
                        "offset": offset, "nbytes": array.nbytes})
        prepared.append((offset, array))
        end = offset + array.nbytes
    header = json.dumps({"key": check_key(key), "arrays": entries}, separators=(",", ":")).encode()
    data_start = _aligned(_PREFIX.size + len(header))
    image = bytearray(data_start + end)
    _PREFIX.pack_into(image, 0, MAGIC, FORMAT_VERSION, len(header), len(image), bytes(32))
    image[_PREFIX.size:_PREFIX.size + len(header)] = header
    view = memoryview(image)
    for offset, array in prepared:
        view[data_start + offset:data_start + offset + array.nbytes] = array.reshape(-1).view(np.uint8)
    image[_DIGEST_AT:_PREFIX.size] = _digest(image)
    return image


def decode(key: str, data, *, verify: bool = True) -> dict[str, np.ndarray]:
    """The arrays of a file image as read-only views of `data`; BadStateFile if it is not a whole,
    current-format file written for `key` (its digest checked unless `verify` is False)."""
    data = memoryview(data).toreadonly()
    if len(data) < _PREFIX.size:
        raise BadStateFile(f"{len(data)} bytes, shorter than the file prefix")
    magic, version, header_length, length, digest = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise BadStateFile("not a warm-start state file")
    if version != FORMAT_VERSION:
        raise BadStateFile(f"format version {version}; this Kinetic reads version {FORMAT_VERSION}")
    if length != len(data):
        raise BadStateFile(f"{len(data)} bytes where the file says {length} (truncated or extended)")
    if verify and _digest(data) != digest:
        raise BadStateFile("contents do not match the file's BLAKE3 digest")
    try:
        header = json.loads(bytes(data[_PREFIX.size:_PREFIX.size + header_length]))
        if header["key"] != key:
            raise BadStateFile(f"written for key {header['key']!r}")
        data_start = _aligned(_PREFIX.size + header_length)
        return dict(_array_view(data, data_start, entry) for entry in header["arrays"])
    except (ValueError, KeyError, TypeError) as exc:  # json, dtype and shape errors included
        raise BadStateFile(f"unreadable header ({exc})") from exc


def _array_view(data: memoryview, data_start: int, entry: dict) -> tuple[str, np.ndarray]:
    dtype = np.dtype(entry["dtype"])
    shape = tuple(int(n) for n in entry["shape"])
    count = int(np.prod(shape, dtype=np.int64))
    start = data_start + int(entry["offset"])
    if dtype.kind not in _ARRAY_KINDS or min(shape, default=0) < 0 or start + count * dtype.itemsize > len(data):
        raise BadStateFile(f"array {entry['name']!r} does not fit the file")
    if count == 0:
        array = np.empty(shape, dtype)
        array.flags.writeable = False
        return entry["name"], array
    return entry["name"], np.frombuffer(data, dtype, count, start).reshape(shape)
