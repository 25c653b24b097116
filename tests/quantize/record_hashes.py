"""Records what llama-quantize writes, for test_llama_identity.py: run by hand where llama.cpp is built
(`python -m tests.quantize.record_hashes [LLAMA_QUANTIZE]`), never by the test suite.

For each real model, each input (F32 and F16 files from tests/quantize/inputs.py, and llama-quantize's
own Q8_0 of the F32 file, read with --allow-requantize) and each target type, it runs llama-quantize
and stores in tests/data/quantize/llama_quantize.json the SHA-256 of the whole output file and of its
metadata, and each tensor's type and the first 16 hex digits of the SHA-256 of its bytes (the
tensor names once per model: every output of a model has them in the same order). The outputs
themselves are deleted.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from gguf import GGUFReader

from tests.quantize.inputs import MODELS, file_sha256, input_file

RECORD = Path(__file__).parents[1] / "data" / "quantize" / "llama_quantize.json"
TYPES = ("Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_1", "Q4_0", "Q3_K_M")
DEFAULT_TOOL = Path.home() / ".cache/kinetic-ref/llama.cpp/build/bin/llama-quantize"


def output_record(path: Path) -> tuple[list[str], dict]:
    """The tensor names in file order, and the record of one output: the file's SHA-256, its
    metadata's (everything before the first tensor's data), each tensor's type and the first 16 hex
    digits of its bytes' SHA-256 (space-separated, in the names' order)."""
    reader = GGUFReader(path)
    with open(path, "rb") as f:
        meta = f.read(reader.data_offset)
    return [t.name for t in reader.tensors], {
        "file": file_sha256(path), "meta": hashlib.sha256(meta).hexdigest(),
        "types": " ".join(t.tensor_type.name for t in reader.tensors),
        "tensors": " ".join(hashlib.sha256(t.data.tobytes()).hexdigest()[:16] for t in reader.tensors)}


def quantize(tool: Path, src: Path, dst: Path, target: str) -> None:
    subprocess.run([str(tool), "--allow-requantize", str(src), str(dst), target, "2"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def record(tool: Path) -> dict:
    result = {}
    with tempfile.TemporaryDirectory(dir=Path.home() / ".cache") as tmp:
        for model in MODELS:
            inputs = {kind: input_file(model, kind) for kind in ("F32", "F16")}
            inputs["Q8_0"] = Path(tmp, f"{model}.Q8_0-input.gguf")
            quantize(tool, inputs["F32"], inputs["Q8_0"], "Q8_0")
            entry = result[model] = {"inputs": {k: file_sha256(p) for k, p in inputs.items()}, "outputs": {}}
            for kind, src in inputs.items():
                for target in (*TYPES, *(("F16",) if kind == "F32" else ())):
                    dst = Path(tmp, "out.gguf")
                    quantize(tool, src, dst, target)
                    entry["tensor_names"], entry["outputs"][f"{kind}->{target}"] = output_record(dst)
                    dst.unlink()
                    print(model, kind, target, flush=True)
    return result


if __name__ == "__main__":
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    data = record(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_TOOL)
    RECORD.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
