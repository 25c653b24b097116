"""Record llama.cpp's greedy tokens for SmolLM2 with tests/lora's random adapter (scale 1 and 0.5).

Writes tests/data/lora/smollm2_lora_reference.json: the adapter's BLAKE3 and, per scale (1, 0.5,
and 0: no adapter) and prompt, llama-server's tokens and top-2 log-probabilities per step (`--lora`
/ `--lora-scaled FILE:0.5`, /completion with temperature 0, no prompt cache, one slot). CI has no
llama.cpp; tests/lora/test_lora_model.py compares against this file.

    .venv/bin/python scripts/record_lora_reference.py [--bin ~/.cache/kinetic-ref/llama.cpp/build/bin]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "lora"))

from adapter_file import SMOLLM2_ADAPTER, write_adapter  # noqa: E402  (tests/lora is not a package)

from kinetic.hub import resolve_model  # noqa: E402
from kinetic.receipts.hashing import file_blake3  # noqa: E402

PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):"]
N_PREDICT = 24
OUT = ROOT / "tests" / "data" / "lora" / "smollm2_lora_reference.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


def tokens_with(server: Path, model: Path, lora_flags: list[str]) -> dict[str, dict]:
    port = free_port()
    proc = subprocess.Popen([str(server), "-m", str(model), "--port", str(port), "-np", "1", "-c", "512", "-t", "2",
                             *lora_flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        out = {}
        for prompt in PROMPTS:
            answer = post(port, {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "top_k": 1,
                                 "cache_prompt": False, "return_tokens": True, "ignore_eos": True, "n_probs": 2})
            top2 = [[{"id": t["id"], "logprob": t["logprob"]} for t in step["top_logprobs"][:2]]
                    for step in answer["completion_probabilities"]]
            out[prompt] = {"ids": answer["tokens"], "top2": top2}
        return out
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bin", type=Path, default=Path("~/.cache/kinetic-ref/llama.cpp/build/bin").expanduser())
    args = p.parse_args()
    model = resolve_model("smollm2-135m")
    with tempfile.TemporaryDirectory() as tmp:
        adapter = write_adapter(model, Path(tmp) / "adapter.gguf", SMOLLM2_ADAPTER)
        record = {"model_blake3": file_blake3(model), "adapter_blake3": file_blake3(adapter),
                  "n_predict": N_PREDICT, "llama_cpp": "b1-0c1e570 llama-server, CPU",
                  "scales": {"1.0": tokens_with(args.bin / "llama-server", model, ["--lora", str(adapter)]),
                             "0.5": tokens_with(args.bin / "llama-server", model, ["--lora-scaled", f"{adapter}:0.5"]),
                             "0.0": tokens_with(args.bin / "llama-server", model, [])}}
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
