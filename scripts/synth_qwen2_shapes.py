"""Synthetic qwen2 files of other shapes, with llama.cpp's reference outputs, for tests/data/synthetic.

Owns: the shapes below (layers, heads, GQA ratio, head size, quantization mix, tied output), each
written as tests/data/synthetic/qwen2-<shape>/qwen2-<shape>.{gguf,json,npz}. Does not own the
generator: it drives /work/shared/tools/synth_models.py (weights, tokenizer donor, llama.cpp's
logits through llama-cpp-python's ctypes bindings) with these specs in place of its one qwen2 spec.
Every weight type here has a CPU, CUDA and Vulkan kernel, so each file runs on every device.

    LLAMA_CPP_LIB_PATH=~/.cache/kinetic-ref/llama.cpp/build/bin \\
    LLAMA_CPP_PY=~/.cache/kinetic-ref/lcp/llama_cpp_python-0.3.36/llama_cpp \\
    SYNTH_MODELS=~/.local/share/kinetic/models python scripts/synth_qwen2_shapes.py gqa4
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

TOOLS = Path(os.environ.get("SYNTH_TOOLS", "/work/shared/tools"))
DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "synthetic"


def shapes(sm) -> dict:
    """shape name -> (spec keywords for synth_models.spec, its metadata)."""
    qt = sm.QT
    return {
        # 2 layers, 8 heads x 64 over KV 2 (GQA 4), tied output, legacy block types
        "gqa4": (dict(tok="bpe", mode="mix", tied=True, emb_type=qt.Q8_0, include=[r"attn_(q|k|v)\.bias$"],
                      types=[(r"attn_(q|output)\.weight", qt.Q4_0), (r"attn_(k|v)\.weight", qt.Q8_0),
                             (r"ffn_(gate|up)", qt.Q5_0), (r"ffn_down", qt.Q4_1)],
                      desc="2 layers, 8 heads x 64, GQA 8/2, q/k/v biases, tied output, Q4_0/Q8_0/Q5_0/Q4_1"),
                 sm.std_meta("qwen2", n_layer=2, n_embd=512, n_head=8, n_head_kv=2, n_ff=512, rope_base=10000.0)),
        # 1 layer, 2 heads x 128 over one KV head, untied output, legacy block types
        "h128": (dict(tok="bpe", mode="mix", tied=False, out_type=qt.Q8_0, emb_type=qt.Q8_0,
                      include=[r"attn_(q|k|v)\.bias$"],
                      types=[(r"attn_q\.weight", qt.Q8_0), (r"attn_k\.weight", qt.Q4_0), (r"attn_v\.weight", qt.Q4_1),
                             (r"attn_output", qt.Q5_0), (r"ffn_gate", qt.Q8_0), (r"ffn_up", qt.Q4_0),
                             (r"ffn_down", qt.Q4_1)],
                      desc="1 layer, 2 heads x 128, GQA 2/1, q/k/v biases, untied output, Q8_0/Q4_0/Q4_1/Q5_0"),
                 sm.std_meta("qwen2", n_layer=1, n_embd=256, n_head=2, n_head_kv=1, n_ff=256, rope_base=1000000.0)),
    }


def main(shape: str) -> None:
    sys.path.insert(0, str(TOOLS))
    import synth_models as sm

    keywords, meta = shapes(sm)[shape]
    out = Path(tempfile.mkdtemp(prefix="synth-qwen2-"))
    sm.OUT, sm.WORK = str(out), str(out / "work")
    sm.SPECS["qwen2"] = dict(arch="qwen2", meta_fn=lambda: meta, **keywords)
    sm.capture_logs()
    sm.run_all("qwen2")
    name = f"qwen2-{shape}"
    dest = DATA / name
    dest.mkdir(parents=True, exist_ok=True)
    for ext in ("gguf", "npz"):
        shutil.copy(out / "qwen2" / f"qwen2.{ext}", dest / f"{name}.{ext}")
    doc = json.loads((out / "qwen2" / "qwen2.json").read_text())
    doc["file"] = f"{name}.gguf"
    doc["generator"]["script"] = f"scripts/synth_qwen2_shapes.py {shape}"
    (dest / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {dest}")


if __name__ == "__main__":
    main(sys.argv[1])
