"""Writing variants of the synthetic GGUF files for tests (renamed, dropped or extra tensors,
changed metadata), with the `gguf` package's reader and writer."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np

SYNTHETIC = Path(__file__).parent / "data" / "synthetic"


def synthetic_files(*, embeddings: bool = False) -> list[str]:
    """Every synthetic file of a registered family: <arch>/ and its other shapes, <arch>-<shape>/ (the
    family is the json's "arch", so hyphenated architectures such as hunyuan-dense work). By default
    the generative files (llama.cpp's logits); embeddings=True: the embedding models' files (llama.cpp's
    token and pooled embeddings, tests/runtime/test_embeddings.py)."""
    from kinetic.frontend.families import supported_architectures

    archs = supported_architectures()
    return sorted(d.name for d in SYNTHETIC.iterdir()
                  if d.is_dir() and _doc(d)["arch"] in archs and _is_embedding(_doc(d)) == embeddings)


def _doc(folder: Path) -> dict:
    return json.loads((folder / f"{folder.name}.json").read_text())


def _is_embedding(doc: dict) -> bool:
    """Files made for embedding models record token embeddings, not logits."""
    return "token_embedding_std" in doc["compare"]["p0"]


def synthetic_arch(name: str) -> str:
    return json.loads((SYNTHETIC / name / f"{name}.json").read_text())["arch"]


def synthetic_path(arch: str) -> Path:
    return SYNTHETIC / arch / f"{arch}.gguf"


def logits_beside_llama_cpp(name: str, *, engine=None, prompts: tuple[str, ...] = ("p0", "p1")):
    """For each recorded prompt of a synthetic file (p0, p1): our logits at every prompt position in one
    pass of a fresh sequence (f32 [T, n_vocab]; `engine`, or a 64-token one on the default device), and
    llama.cpp's top token ids and their logits at each position (its one-token-at-a-time path, [T, k])."""
    from kinetic.ir.rows import PassRows

    ref = np.load(SYNTHETIC / name / f"{name}.npz")
    engine = engine or _engine(name)
    for prompt in prompts:
        ids = ref[f"{prompt}_ids"].tolist()
        logits = engine.forward(PassRows.chain(ids, 0, outputs="all"), {0: engine.new_sequence()})
        yield logits, ref[f"{prompt}_seq_top_ids"], ref[f"{prompt}_seq_top_logits"]


def top_logit_gap(engine, name: str, prompt: str) -> float:
    """The largest difference between `engine`'s logits and llama.cpp's over llama.cpp's top tokens at
    every position of one recorded prompt of a synthetic file (0.0: they agree exactly)."""
    ((logits, top_ids, top_logits),) = logits_beside_llama_cpp(name, engine=engine, prompts=(prompt,))
    return float(np.abs(np.take_along_axis(logits, top_ids, axis=1) - top_logits).max())


def _engine(name: str):
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.frontend.lower import lower
    from kinetic.runtime.engine import Engine
    from kinetic.runtime.weights import GGUFWeights

    file = open_gguf(synthetic_path(name))
    return Engine(lower(file), GGUFWeights(file), n_ctx=64)


def rewrite_gguf(src: Path, dst: Path, *, rename: dict[str, str] | None = None, drop: set[str] = frozenset(),
                 extra: dict[str, np.ndarray] | None = None, set_kv: dict[str, object] | None = None) -> Path:
    """Copy src to dst with tensors renamed or dropped, f32 tensors added, metadata replaced or added
    (a str, bool, int (int32), float (float32) or a list of one of those)."""
    rename, extra, set_kv = rename or {}, extra or {}, set_kv or {}
    reader = gguf.GGUFReader(src)
    arch = set_kv.get("general.architecture") or reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment"):
            continue
        if key in set_kv:
            _add_value(writer, key, set_kv[key])
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    for key, value in set_kv.items():
        if key not in reader.fields and key != "general.architecture":
            _add_value(writer, key, value)
    for t in reader.tensors:
        if t.name in drop:
            continue
        writer.add_tensor(rename.get(t.name, t.name), np.asarray(t.data), raw_dtype=t.tensor_type)
    for name, values in extra.items():
        writer.add_tensor(name, values.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def _value_type(value: object) -> gguf.GGUFValueType:
    kinds = ((str, gguf.GGUFValueType.STRING), (bool, gguf.GGUFValueType.BOOL), (int, gguf.GGUFValueType.INT32),
             (float, gguf.GGUFValueType.FLOAT32))
    return next(t for kind, t in kinds if isinstance(value, kind))


def _add_value(writer: gguf.GGUFWriter, key: str, value: object) -> None:
    if isinstance(value, list):
        writer.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=_value_type(value[0]))
    else:
        writer.add_key_value(key, value, _value_type(value))
