"""What a GGUF file's name says: its quantization, whether it is one part of a split model, and
whether it is a vision projector rather than a model.

Owns: the naming conventions that llama.cpp's tools, Hugging Face repositories, LM Studio and
`kinetic pull` share (`Qwen3-4B-Q4_K_M.gguf`, `model-Q8_0-00001-of-00003.gguf`,
`mmproj-model-f16.gguf`). Does not own reading files (kinetic.frontend) or where files live
(kinetic.stores.layouts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# ggml's quantization names as they appear in file names, longest alternatives first so that
# Q4_K_M wins over Q4_K; a name is bounded by a non-alphanumeric character on both sides.
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])("
    r"IQ[1-4]_(?:XXS|XS|NL|S|M)|Q[2-6]_K(?:_(?:XXL|XL|S|M|L))?|Q[4-8]_[01]|Q[1-8]_K"
    r"|TQ[12]_0|MXFP4(?:_MOE)?|NVFP4|BF16|F16|F32"
    r")(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class SplitPart:
    stem: str  # the name before -0000N-of-0000M
    number: int  # 1-based
    count: int


def quant_from_name(filename: str) -> str | None:
    """The quantization a file name states (upper case, as llama.cpp writes it), or None. The last
    one wins: `Llama-3-8B-Q4_K_M.gguf` -> Q4_K_M, `model.f16.Q8_0.gguf` -> Q8_0."""
    found = _QUANT.findall(filename)
    return found[-1].upper() if found else None


def split_part(filename: str) -> SplitPart | None:
    """The part this file is of a model split by llama-gguf-split (`-00001-of-00003.gguf`), or None."""
    m = _SPLIT.match(filename)
    if m is None or int(m["count"]) < 1 or not 1 <= int(m["no"]) <= int(m["count"]):
        return None
    return SplitPart(m["stem"], int(m["no"]), int(m["count"]))


def is_projector(filename: str) -> bool:
    """A vision projector (`mmproj-*.gguf`) travels with a model but is not one itself."""
    return "mmproj" in filename.lower()


def is_gguf(filename: str) -> bool:
    return filename.lower().endswith(".gguf")


def same_quant(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a.upper() == b.upper()
