"""Single-client decode on a busy machine: Kinetic's compiled step with 1 and with N threads, quiet
and beside one busy process per core (issue 21: ">= 0.8 x its 1-thread speed on a quiet machine"),
and llama.cpp's llama-bench under the same load when it is found.

    python benchmarks/under_load.py [MODEL] [--tokens 64] [--threads 2] [--repeat 3] [--busy N]
                                    [--llama-bench PATH]

Each measurement is greedy decode of --tokens tokens after a one-token prompt (engine.decode, no
sampling, no drafting: the step and its threads alone), repeated --repeat times in rounds that
alternate the thread counts; medians are printed. The busy processes are `nice -n 0` Python loops,
one per logical CPU unless --busy says otherwise, started before the loaded rounds and ended after.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from kinetic.model import Model

LLAMA_BENCH = Path.home() / ".cache/kinetic-ref/llama.cpp/build/bin/llama-bench"
BUSY_LOOP = "while True: pass"


def decode_speed(model: Model, tokens: int) -> float:
    """Tokens per second of `tokens` greedy decode passes of one sequence."""
    engine = model.engine
    seq = engine.new_sequence()
    logits = engine.prefill(seq, [1])
    start = time.perf_counter()
    for _ in range(tokens):
        logits = engine.decode(seq, int(np.argmax(logits)))
    return tokens / (time.perf_counter() - start)


def llama_speed(bench: Path, model_path: str, threads: int, tokens: int) -> float | None:
    """llama-bench's tg speed for -t threads (None if it fails)."""
    run = subprocess.run([str(bench), "-m", model_path, "-t", str(threads), "-n", str(tokens), "-p", "0", "-r", "1",
                          "-o", "csv"], capture_output=True, text=True, timeout=600)
    rows = list(csv.DictReader(io.StringIO(run.stdout)))
    if run.returncode or not rows or "avg_ts" not in rows[-1]:
        return None
    return float(rows[-1]["avg_ts"])


def start_busy(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen(["nice", "-n", "0", sys.executable, "-c", BUSY_LOOP]) for _ in range(n)]


def stop_busy(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()


def measure(models: dict[int, Model], args, bench: Path | None, path: str) -> dict[str, list[float]]:
    """One round per repeat, thread counts alternating order; llama-bench last in each round."""
    results: dict[str, list[float]] = {}
    for r in range(args.repeat):
        order = sorted(models) if r % 2 == 0 else sorted(models, reverse=True)
        for t in order:
            results.setdefault(f"kinetic -t {t}", []).append(decode_speed(models[t], args.tokens))
        if bench is not None:
            for t in order:
                speed = llama_speed(bench, path, t, args.tokens)
                if speed is not None:
                    results.setdefault(f"llama.cpp -t {t}", []).append(speed)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="the multi-threaded count [default: 2]")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--busy", type=int, default=os.cpu_count(), help="busy processes [default: one per CPU]")
    found = str(LLAMA_BENCH) if LLAMA_BENCH.exists() else shutil.which("llama-bench")
    parser.add_argument("--llama-bench", default=found, help="llama-bench to compare [default: the built one]")
    args = parser.parse_args()
    if args.llama_bench and not Path(args.llama_bench).is_file():
        parser.error(f"--llama-bench {args.llama_bench}: no such file (build llama.cpp as ../shared/llama-cpp.md "
                     "says, or pass --llama-bench '' to measure Kinetic alone)")
    models = {t: Model(args.model, n_ctx=512, threads=t) for t in sorted({1, args.threads})}
    path = str(models[1].path)
    bench = Path(args.llama_bench) if args.llama_bench else None
    for m in models.values():
        decode_speed(m, 8)  # warm-up: compile and load kernels
    quiet = measure(models, args, bench, path)
    busy = start_busy(args.busy)
    try:
        time.sleep(1.0)
        loaded = measure(models, args, bench, path)
        load = os.getloadavg()[0]
    finally:
        stop_busy(busy)
    print(f"{args.model}, {args.tokens} tokens, medians of {args.repeat}; {args.busy} busy processes, "
          f"load {load:.2f} while loaded")
    print(f"{'':18s} {'quiet t/s':>10s} {'loaded t/s':>11s} {'loaded / quiet 1-thread':>24s}")
    for name in quiet:
        q, lo = statistics.median(quiet[name]), statistics.median(loaded.get(name, [float("nan")]))
        one = statistics.median(quiet[name.rsplit(" ", 1)[0] + " 1"])
        print(f"{name:18s} {q:10.1f} {lo:11.1f} {lo / one:24.2f}", flush=True)


if __name__ == "__main__":
    main()
