"""Writing the GGUF files the benchmarks generate (random weights of real shapes).

Owns: one writer for a generated file (a donor file's keys copied, the family's `arch.`-prefixed
hyperparameters, the tensors as given), random quant bytes with small finite scales, and the donor
used when the device machine has no real model (tests/data/synthetic/llama's tokenizer).
Does not own: any family's shape or tensor list (each benchmark yields its own tensors).

Scripts beside it import it by name: running `python benchmarks/X.py` puts this folder on sys.path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_FROM = ROOT / "tests" / "data" / "synthetic" / "llama" / "llama.gguf"
# the byte offsets of each block's f16 scales, drawn small and finite by random_quant
SCALE_FIELDS = {Q.Q8_0: (0,), Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q4_K: (0, 2),
                Q.Q6_K: (208,)}
# (name, data as written, its ggml type; None lets the writer take it from a float array's dtype)
Tensor = tuple[str, np.ndarray, "Q | None"]


def random_quant(rng: np.random.Generator, wtype: Q, rows: int, cols: int) -> np.ndarray:
    """u8 [rows, row bytes]: random quant bytes, every f16 scale drawn small and finite."""
    block, size = gguf.GGML_QUANT_SIZES[wtype]
    blocks = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for off in SCALE_FIELDS[wtype]:
        scales = (np.abs(rng.standard_normal(blocks.shape[:2])) * 0.01 + 1e-4).astype(np.float16)
        blocks[:, :, off : off + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(rows, -1)


def donor_vocab(donor: Path) -> int:
    """How many tokens the donor file's tokenizer has."""
    return len(gguf.GGUFReader(donor).fields["tokenizer.ggml.tokens"].contents())


def not_donor_arch(key: str) -> bool:
    """Keeps every key of the llama donor but its own architecture's and the file's layout."""
    return not key.startswith(("GGUF.", "llama.")) and key not in ("general.architecture", "general.alignment")


def tokenizer_only(key: str) -> bool:
    """Keeps the donor's tokenizer keys alone."""
    return key.startswith("tokenizer.")


def write_gguf(
    *,
    dest: Path,
    arch: str,
    donor: Path,
    keep: Callable[[str], bool],
    uints: dict[str, int],
    floats: dict[str, float],
    tensors: Iterable[Tensor],
    arrays: dict[str, list[int]] | None = None,
    general: Callable[[gguf.GGUFWriter], None] | None = None,
) -> Path:
    """Writes `dest`: the donor's kept keys, then `general(writer)`, then the `arch.` keys (uints, arrays,
    floats in that order), then the tensors; returns `dest`."""
    reader = gguf.GGUFReader(donor)
    writer = gguf.GGUFWriter(dest, arch)
    for key, field in reader.fields.items():
        if keep(key):
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    if general is not None:
        general(writer)
    for key, value in uints.items():
        writer.add_uint32(f"{arch}.{key}", value)
    for key, values in (arrays or {}).items():
        writer.add_array(f"{arch}.{key}", values)
    for key, value in floats.items():
        writer.add_float32(f"{arch}.{key}", value)
    for name, data, raw_dtype in tensors:
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest
