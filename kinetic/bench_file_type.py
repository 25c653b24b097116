"""The file type a bench card names: llama.cpp's name for a GGUF file's `general.file_type`.

Owns: `file_type_name(metadata, tensors)`, the words llama.cpp's `llama_model_ftype_name` prints for
the code (and llama-bench's `model` column ends with): 15 -> "Q4_K - Medium", 3 -> "Q4_1". The
type holding most of the file's bytes is not the file type: Gemma 3 270M Q4_K_M keeps its large
embedding table in Q8_0. A file without the key is named, as llama.cpp names it, by a guess (here
the type with the most bytes) marked "(guessed)". Does not own reading the file (kinetic.frontend).

The names are data copied from llama.cpp's src/llama-model-loader.cpp: only the codes whose name is
not the gguf package's LlamaFileType name without its MOSTLY_ prefix are listed.
"""

from __future__ import annotations

from collections import Counter

from gguf import LlamaFileType

_NAMES = {
    0: "all F32", 10: "Q2_K - Medium", 21: "Q2_K - Small", 11: "Q3_K - Small", 12: "Q3_K - Medium",
    13: "Q3_K - Large", 14: "Q4_K - Small", 15: "Q4_K - Medium", 16: "Q5_K - Small", 17: "Q5_K - Medium",
    36: "TQ1_0 - 1.69 bpw ternary", 37: "TQ2_0 - 2.06 bpw ternary", 19: "IQ2_XXS - 2.0625 bpw",
    20: "IQ2_XS - 2.3125 bpw", 28: "IQ2_S - 2.5 bpw", 29: "IQ2_M - 2.7 bpw", 22: "IQ3_XS - 3.3 bpw",
    23: "IQ3_XXS - 3.0625 bpw", 24: "IQ1_S - 1.5625 bpw", 31: "IQ1_M - 1.75 bpw", 25: "IQ4_NL - 4.5 bpw",
    30: "IQ4_XS - 4.25 bpw", 26: "IQ3_S - 3.4375 bpw", 27: "IQ3_S mix - 3.66 bpw", 38: "MXFP4 MoE",
}


def file_type_name(metadata: dict, tensors: dict) -> str:
    """llama.cpp's name for the file's type; `tensors` (name -> info with .type and .nbytes) only
    serve a file whose metadata has no (known) general.file_type."""
    code = metadata.get("general.file_type")
    if isinstance(code, int) and not isinstance(code, bool):
        if code in _NAMES:
            return _NAMES[code]
        try:
            member = LlamaFileType(code)
        except ValueError:
            member = None
        if member is not None and member is not LlamaFileType.GUESSED:
            return member.name.removeprefix("MOSTLY_")
    return f"{_largest_type(tensors)} (guessed)"


def _largest_type(tensors: dict) -> str:
    nbytes: Counter[str] = Counter()
    for info in tensors.values():
        nbytes[info.type.name] += info.nbytes
    return nbytes.most_common(1)[0][0] if nbytes else "unknown"
