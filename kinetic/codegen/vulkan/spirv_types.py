"""The SPIR-V emitter's shared records: one instruction's words, literal strings, what a type id is,
and the handles of storage buffers and workgroup arrays.

Owns: `instruction` (spec 3.2: word count and opcode, then the operands), `string_words` (spec
2.2.1), `TypeInfo`, `Buffer` and `Shared`, which the module builder (spirv.py) and the function
builder (spirv_function.py) both use. Does not own any instruction's meaning (spirv_spec.py has the
numbers) or building modules.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass


def instruction(op: int, operands: Sequence[int]) -> list[int]:
    """One instruction: word count and opcode in the first word (spec 3.2)."""
    return [((len(operands) + 1) << 16) | int(op), *(int(x) & 0xFFFFFFFF for x in operands)]


def string_words(text: str) -> list[int]:
    """A literal string: UTF-8, nul-terminated, padded with nul bytes to whole words (spec 2.2.1)."""
    data = text.encode() + b"\0"
    data += b"\0" * (-len(data) % 4)
    return list(struct.unpack(f"<{len(data) // 4}I", data))


@dataclass(frozen=True)
class TypeInfo:
    """What a type id is: kind is void, bool, int, float, vector, array, struct, pointer or function."""

    kind: str
    width: int = 0
    signed: bool = False
    elem: int = 0  # element / pointee type id
    count: int = 0  # vector size or array length (0: runtime array)
    storage: int = -1  # pointer storage class


@dataclass(frozen=True)
class Buffer:
    """A storage-buffer binding: `var` points to a Block struct whose member 0 is a runtime array."""

    var: int
    elem: int  # element type id
    binding: int
    readonly: bool


@dataclass(frozen=True)
class Shared:
    """A workgroup (shared-memory) array."""

    var: int
    elem: int
    count: int
