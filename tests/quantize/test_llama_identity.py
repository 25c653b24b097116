"""`kinetic quantize` against llama-quantize on the real models: hashes llama-quantize's outputs left
in tests/data/quantize/llama_quantize.json (record_hashes.py), for F32 and F16 inputs made from both
models and a Q8_0 input made from the F32 one, to every target type.

The default run checks each output's metadata and tensor types (the whole layout, with no input file
made) and a sample of tensors' bytes; the slow run makes the inputs and compares whole files.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from kinetic.frontend.gguf_file import GGUFFile
from kinetic.quantize import gguf_out, run
from kinetic.quantize.encoders import ENCODERS, to_float
from kinetic.user_cache import cache_dir
from tests.quantize import inputs

T = GGMLQuantizationType
RECORD = json.loads((Path(__file__).parents[1] / "data" / "quantize" / "llama_quantize.json").read_text())
COMBOS = [(model, combo) for model in sorted(RECORD) for combo in sorted(RECORD[model]["outputs"])]


def recorded_tensors(model: str, combo: str) -> list[tuple[str, str, str]]:
    """(name, type, first 16 hex digits of the bytes' SHA-256) of each tensor llama-quantize wrote."""
    output = RECORD[model]["outputs"][combo]
    return list(zip(RECORD[model]["tensor_names"], output["types"].split(), output["tensors"].split(), strict=True))
K_TYPES = {"Q3_K", "Q4_K", "Q5_K", "Q6_K"}
SAMPLE_MAX_VALUES = 1 << 22  # the embedding tables (28M and 168M values) are left to the slow run


@cache
def model_file(model: str) -> GGUFFile:
    return GGUFFile(inputs.model_path(model))


@cache
def input_tensors(model: str, kind: str) -> tuple:
    """The input's (name, dims, type) table; the Q8_0 input is the F32 input's Q8_0 output."""
    if kind != "Q8_0":
        return tuple(inputs.input_tensors(model, kind))
    slots, _ = output_slots(model, "F32", "Q8_0")
    return tuple((s.name, s.dims, s.type) for s in slots)


def output_slots(model: str, kind: str, target: str):
    return run.output_tensors(list(input_tensors(model, kind)), run.target_of(target),
                              run.model_facts(model_file(model)))


def split(combo: str) -> tuple[str, str]:
    kind, target = combo.split("->")
    return kind, target


@pytest.mark.parametrize(("model", "combo"), COMBOS)
def test_layout_and_types_match_llama_quantize(model: str, combo: str):
    """Every tensor gets llama-quantize's type, in its order, under metadata identical to its bytes."""
    kind, target = split(combo)
    expected = RECORD[model]["outputs"][combo]
    slots, _ = output_slots(model, kind, target)
    expected_types = [(name, qtype) for name, qtype, _ in recorded_tensors(model, combo)]
    assert [(s.name, s.type.name) for s in slots] == expected_types
    kv_pairs = inputs.model_kv_pairs(inputs.model_path(model))
    metadata = gguf_out.metadata_bytes(kv_pairs, run.target_of(target).file_type, slots)
    assert hashlib.sha256(metadata).hexdigest() == expected["meta"]


def input_values(model: str, kind: str, name: str) -> np.ndarray:
    """A tensor of the input file as llama-quantize reads it: f32 [rows, ncols]."""
    values, _ = inputs.float_tensor(model_file(model), name, "F16" if kind == "F16" else "F32")
    if kind == "Q8_0" and dict((n, t) for n, _, t in input_tensors(model, kind))[name] == T.Q8_0:
        return to_float(ENCODERS[T.Q8_0](values), T.Q8_0, values.shape[1])
    return values.astype(np.float32)


def sample(model: str, combo: str, *, with_k: bool | None = None) -> list[tuple[str, str, str]]:
    """For each type the output converts tensors to, its smallest such tensor. K-quant types only
    from SmolLM2's F32 input or when there is nothing else to sample, to keep the default run short
    (their smallest tensors are ffn_down, a million values; test_encoders.py covers their encoders)."""
    kind, target = split(combo)
    if with_k is None:
        first = sample(model, combo, with_k=kind == "F32" and model == "smollm2-135m")
        return first or (sample(model, combo, with_k=True) if kind != target else [])
    in_types = {n: t for n, _, t in input_tensors(model, kind)}
    sizes = {n: int(np.prod(d)) for n, d, _ in input_tensors(model, kind)}
    smallest: dict[str, tuple[str, str, str]] = {}
    for name, qtype, digest in recorded_tensors(model, combo):
        if in_types[name].name == qtype or (qtype in K_TYPES and not with_k) or sizes[name] > SAMPLE_MAX_VALUES:
            continue
        if qtype not in smallest or sizes[name] < sizes[smallest[qtype][0]]:
            smallest[qtype] = (name, qtype, digest)
    return list(smallest.values())


@pytest.mark.parametrize(("model", "combo"), COMBOS)
def test_sampled_tensors_match_llama_quantize(model: str, combo: str):
    """A sample of tensors (one per output type) encodes to llama-quantize's bytes."""
    kind, target = split(combo)
    samples = sample(model, combo)
    assert samples or kind == target, "nothing sampled: the output would go unchecked"
    for name, qtype, digest in samples:
        encoded = ENCODERS[T[qtype]](input_values(model, kind, name))
        assert hashlib.sha256(encoded.tobytes()).hexdigest()[:16] == digest, f"{name} as {qtype}"


def input_path(model: str, kind: str) -> Path:
    if kind != "Q8_0":
        return inputs.input_file(model, kind)
    source = inputs.input_file(model, "F32")
    path = cache_dir("quantize-inputs", source.name.replace(".F32.", ".Q8_0."))
    if not path.exists():
        run.quantize_file(source, path, "Q8_0")
    return path


@pytest.mark.slow
@pytest.mark.parametrize(("model", "combo"), COMBOS)
def test_whole_file_matches_llama_quantize(model: str, combo: str, tmp_path: Path):
    """The whole output file is byte for byte llama-quantize's, from the very inputs it read."""
    kind, target = split(combo)
    source = input_path(model, kind)
    assert inputs.file_sha256(source) == RECORD[model]["inputs"][kind], "the input differs from the one recorded"
    run.quantize_file(source, tmp_path / "out.gguf", target, threads=2)
    assert inputs.file_sha256(tmp_path / "out.gguf") == RECORD[model]["outputs"][combo]["file"]
