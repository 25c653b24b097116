"""Synthetic files of other shapes per family, with llama.cpp's reference outputs, for tests/data/synthetic.

Owns: writing shape SHAPE of family ARCH as tests/data/synthetic/<arch>-<shape>/<arch>-<shape>.{gguf,json,npz}
(the json's "arch" names the family; tests find files by it). The shapes themselves (layers, heads,
GQA ratio, head size, quantization mix, tied output, rotary scaling) live in scripts/shapes/<arch>.py
(`-` in the name as `_`). Does not own the generator: it drives /work/shared/tools/synth_models.py
(weights, tokenizer donor, llama.cpp's logits through llama-cpp-python's ctypes bindings, llama-quantize
for K-quant mixes) with a shape's spec in place of the family's one spec.

    LLAMA_CPP_LIB_PATH=~/.cache/kinetic-ref/llama.cpp/build/bin \\
    LLAMA_CPP_PY=~/.cache/kinetic-ref/lcp/llama_cpp_python-0.3.36/llama_cpp \\
    SYNTH_MODELS=~/.local/share/kinetic/models python scripts/synth_shapes.py qwen2 gqa4
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

TOOLS = Path(os.environ.get("SYNTH_TOOLS", "/work/shared/tools"))
DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "synthetic"


def main(arch: str, shape: str) -> None:
    sys.path.insert(0, str(TOOLS))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import synth_models as sm

    family_shapes = importlib.import_module(f"shapes.{arch.replace('-', '_')}").shapes(sm)
    keywords, meta = family_shapes[shape]
    out = Path(tempfile.mkdtemp(prefix=f"synth-{arch}-"))
    sm.OUT, sm.WORK = str(out), str(out / "work")
    sm.SPECS[arch] = dict(arch=arch, meta_fn=lambda: meta, **keywords)
    sm.capture_logs()
    sm.run_all(arch)
    name = f"{arch}-{shape}"
    dest = DATA / name
    dest.mkdir(parents=True, exist_ok=True)
    for ext in ("gguf", "npz"):
        shutil.copy(out / arch / f"{arch}.{ext}", dest / f"{name}.{ext}")
    doc = json.loads((out / arch / f"{arch}.json").read_text())
    doc["file"] = f"{name}.gguf"
    doc["generator"]["script"] = f"scripts/synth_shapes.py {arch} {shape}"
    (dest / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {dest}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
