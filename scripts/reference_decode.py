#!/usr/bin/env python3
"""Reference data: llama.cpp's logits when every token is fed one at a time (its decode path).

llama-server's golden continuations (tests/data/golden) ran each prompt through llama.cpp's batch
kernels, which round differently from its one-token decode kernels; Kinetic gives every row the
decode path's numerics, whatever the batch. This script runs llama.cpp on the golden prompt plus
llama.cpp's golden continuation, one token at a time, and stores the two likeliest tokens and their
exact logits at each continuation step in tests/data/reference/<model>.json.

    python scripts/reference_decode.py --llama-cpp ~/.cache/kinetic-ref/llama.cpp

Needs a llama.cpp build (../shared/llama-cpp.md); tests only read the JSON it writes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "data" / "golden"
OUT = ROOT / "tests" / "data" / "reference"
MODELS = {"smollm2-135m": "smollm2-135m-instruct-q4_1.json", "gemma3-270m": "gemma-3-270m-q4_k_m.json"}


def build_tool(lcp: Path, workdir: Path) -> Path:
    exe = workdir / "tf"
    cmd = ["g++", "-O2", "-std=c++17", str(ROOT / "scripts" / "llama_teacher_forced.cpp"), f"-I{lcp / 'include'}",
           f"-I{lcp / 'ggml' / 'include'}", f"-L{lcp / 'build' / 'bin'}", "-lllama", "-lggml", "-lggml-base",
           "-o", str(exe)]
    subprocess.run(cmd, check=True)
    return exe


def decode_logits(exe: Path, lcp: Path, model: Path, tokens: list[int], workdir: Path) -> np.ndarray:
    ids, out = workdir / "ids.txt", workdir / "logits.f32"
    ids.write_text(" ".join(map(str, tokens)))
    env = {**os.environ, "LD_LIBRARY_PATH": str(lcp / "build" / "bin")}
    subprocess.run([str(exe), str(model), str(ids), "1", str(out)], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return np.fromfile(out, np.float32).reshape(len(tokens), -1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source folder with build/bin")
    args = parser.parse_args()
    from kinetic import hub

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_tool(args.llama_cpp, Path(tmp))
        for name, golden_file in MODELS.items():
            golden = json.loads((GOLDEN / golden_file).read_text())
            cases = {}
            for kind in ("raw", "chat"):
                for i, case in enumerate(golden[kind]):
                    prompt, ids = case["prompt_ids"], case["ids"]
                    logits = decode_logits(exe, args.llama_cpp, hub.resolve_model(name), prompt + ids[:-1], Path(tmp))
                    steps = logits[len(prompt) - 1 :]
                    top = np.argsort(-steps, axis=1, kind="stable")[:, :2]
                    cases[f"{kind}{i}"] = {
                        "tokens": prompt + ids[:-1],
                        "prompt_tokens": len(prompt),
                        "top2": [[int(a), float(steps[s, a]), int(b), float(steps[s, b])]
                                 for s, (a, b) in enumerate(top)],
                    }
                    print(f"{name} {kind}[{i}]: {len(steps)} steps", flush=True)
            data = {"llama_cpp": "b1-0c1e570, CPU, 2 threads, flash attention auto, one token per decode",
                    "model": name, "cases": cases}
            (OUT / f"{name}.json").write_text(json.dumps(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
