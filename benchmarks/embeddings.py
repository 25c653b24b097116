"""Embeddings per second for N short texts: Kinetic (Model.embed in process, and `kinetic serve` over
HTTP) against llama-server --embedding on the same file and thread count, each answering one
/v1/embeddings request of all N texts (OpenAI shape, float). The texts are short sentences of 5 to 14
words. Each engine's vectors are checked against the other's (cosine >= 0.9999).

    python benchmarks/embeddings.py MODEL.gguf [--texts 512] [--threads 2] [--repeat 3]

llama-server comes from ~/.cache/kinetic-ref/llama.cpp/build/bin (docs in /work/shared/llama-cpp.md);
without it only Kinetic's numbers are printed. llama-server runs with -c 8192 -np 16 -b 2048 -ub 2048
(its non-causal models need each input's tokens in one micro-batch; 16 slots batch the inputs).
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

LLAMA_SERVER = Path.home() / ".cache/kinetic-ref/llama.cpp/build/bin/llama-server"
WORDS = ("the river bank fox dog quick lazy bright cold house garden light water stone road music table "
         "window paper morning evening forest mountain city ocean letter summer winter").split()


def texts(n: int) -> list[str]:
    rng = random.Random(7)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 14))).capitalize() + "." for _ in range(n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(command: list[str], port: int, env=None) -> subprocess.Popen:
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"server did not start: {' '.join(command)}")


def over_http(port: int, inputs: list[str], repeat: int) -> tuple[float, np.ndarray]:
    """Median seconds of one /v1/embeddings request of every input, and its vectors."""
    times, vectors = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/embeddings",
                           json={"input": inputs, "encoding_format": "float"}, timeout=3600).json()
        times.append(time.perf_counter() - start)
        vectors = np.array([d["embedding"] for d in sorted(reply["data"], key=lambda d: d["index"])], np.float32)
    return statistics.median(times), vectors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--texts", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    inputs = texts(a.texts)

    from kinetic.model import Model

    model = Model(a.model, n_ctx=512, threads=a.threads, warm_start=False)
    model.embed(inputs[:4])  # compiles the kernels
    runs = []
    for _ in range(a.repeat):
        start = time.perf_counter()
        ours = model.embed(inputs)
        runs.append(time.perf_counter() - start)
    print(f"kinetic Model.embed      {a.texts / statistics.median(runs):8.1f} embeddings/s "
          f"({model.embedder.passes} passes)")
    del model

    port = free_port()
    proc = serve([sys.executable, "-m", "kinetic.cli.main", "serve", a.model, "--embedding", "-t", str(a.threads),
                  "-c", "512", "--port", str(port)], port)
    try:
        seconds, served = over_http(port, inputs, a.repeat)
        print(f"kinetic serve            {a.texts / seconds:8.1f} embeddings/s")
    finally:
        proc.terminate()
    assert np.array_equal(served, ours), "the server's vectors are not Model.embed's"

    if not LLAMA_SERVER.exists():
        print(f"llama-server: not built ({LLAMA_SERVER})")
        return
    port = free_port()
    env = dict(os.environ, LD_LIBRARY_PATH=str(LLAMA_SERVER.parent))
    proc = serve([str(LLAMA_SERVER), "-m", a.model, "--embedding", "-t", str(a.threads), "-c", "8192", "-np", "16",
                  "-b", "2048", "-ub", "2048", "--port", str(port), "-dev", "none", "-ngl", "0"], port, env)
    try:
        seconds, theirs = over_http(port, inputs, a.repeat)
        print(f"llama-server --embedding {a.texts / seconds:8.1f} embeddings/s")
    finally:
        proc.terminate()
    cos = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    print(f"cosine to llama.cpp's vectors: min {cos.min():.6f}, max |difference| {np.abs(ours - theirs).max():.3g}")


if __name__ == "__main__":
    main()
