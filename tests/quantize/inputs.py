"""Float inputs for the quantize tests, made from the real models: every tensor dequantized to F32
(an "F32" file), or the tensors llama-quantize would quantize stored as F16 (an "F16" file).

Owns: making those files (kept under the user cache, `kinetic/quantize-inputs`, keyed by the
model's name and size) and making single tensors of them without the whole file, which is what the
default test run needs. The Q8_0 input is `kinetic quantize F32-file Q8_0`, made by the test itself.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from kinetic import hub
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.quantize import gguf_out
from kinetic.quantize.encoders import to_float
from kinetic.quantize.mixtures import allows_quantization
from kinetic.user_cache import cache_dir

T = GGMLQuantizationType
MODELS = ("smollm2-135m", "gemma3-270m")  # the real models, by their names in Kinetic's catalogue
FILE_TYPES = {"F32": 0, "F16": 1}


def file_sha256(path: Path) -> str:
    """The SHA-256 of a whole file, read in chunks (hashlib.file_digest)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def model_path(model: str) -> Path:
    """The real model's file, fetched on first use (as tests/conftest.py fetches it)."""
    return hub.pull(model, out=lambda _line: None, progress=False)


def float_tensor(gguf: GGUFFile, name: str, kind: str) -> tuple[np.ndarray, GGMLQuantizationType]:
    """A tensor of the real model as the F32 or F16 input holds it: values [rows, ncols] and type."""
    info = gguf.tensors[name]
    dims = gguf_out.ggml_dims(info.ne)
    values = to_float(gguf.array(name), info.type, dims[0])  # f32 [rows, ncols]
    if kind == "F16" and allows_quantization(name, dims):
        return values.astype(np.float16), T.F16
    return values, T.F32


def input_tensors(model: str, kind: str) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """The input file's tensor table (name, dims, type), in file order, without making the file."""
    gguf = GGUFFile(model_path(model))
    return [(name, gguf_out.ggml_dims(info.ne), _input_type(name, info, kind)) for name, info in gguf.tensors.items()]


def _input_type(name: str, info, kind: str) -> GGMLQuantizationType:
    return T.F16 if kind == "F16" and allows_quantization(name, gguf_out.ggml_dims(info.ne)) else T.F32


def input_file(model: str, kind: str) -> Path:
    """The model's F32 or F16 input file, made once and kept in the user cache."""
    source = model_path(model)
    target = cache_dir("quantize-inputs", f"{source.stem}.{source.stat().st_size}.{kind}.gguf")
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_float_file(source, target, kind)
    return target


def model_kv_pairs(source: Path) -> list[bytes]:
    """The real model's key/value pairs as an input (and so every output) copies them."""
    gguf = GGUFFile(source)
    with open(source, "rb") as f:
        return gguf_out.copied_kv_bytes(np.frombuffer(f.read(gguf.data_offset), np.uint8))


def _write_float_file(source: Path, target: Path, kind: str) -> None:
    gguf = GGUFFile(source)
    tensors = [(n, gguf_out.ggml_dims(info.ne), _input_type(n, info, kind)) for n, info in gguf.tensors.items()]
    slots = gguf_out.layout(tensors)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    with open(tmp, "wb") as out:
        out.write(gguf_out.metadata_bytes(model_kv_pairs(source), FILE_TYPES[kind], slots))
        for slot in slots:
            data = float_tensor(gguf, slot.name, kind)[0].tobytes()
            out.write(data + bytes(gguf_out.pad(len(data)) - len(data)))
    os.replace(tmp, target)
