"""A whole prompt through the engine, A/B between two copies of the kinetic package: each round runs
one process per copy (taking turns), each process loads the model once, warms up, then times
--passes prompts of --prompt tokens on --threads threads and reports the process's CPU time per
prompt (a shared machine preempts it; CPU time does not count the waiting). Prints per copy the
median over rounds of each process's best pass, and whether both copies' logits had the same bits.

    python benchmarks/prompt_ab.py gemma3-270m /tmp/kin_old /tmp/kin_new [--prompt 512] [--rounds 5]

A copy is a folder holding a `kinetic` package (e.g. `git archive` of a commit, or the working
tree's kinetic/ with some files put back); it goes first on PYTHONPATH of its processes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np


def _child(model_name: str, prompt: int, passes: int, threads: int) -> None:
    from kinetic.model import Model

    model = Model(model_name, n_ctx=prompt + 16, threads=threads)
    engine = model.engine
    ids = ((np.arange(prompt) * 7919) % 1000 + 100).tolist()
    logits = engine.prefill(engine.new_sequence(), ids)  # warm-up: kernels compiled or loaded
    seconds = []
    for _ in range(passes):
        seq = engine.new_sequence()
        t0 = time.process_time()
        logits = engine.prefill(seq, ids)
        seconds.append(time.process_time() - t0)
    digest = hashlib.sha256(np.ascontiguousarray(logits, np.float32).tobytes()).hexdigest()[:16]
    print(json.dumps({"best": min(seconds), "median": float(np.median(seconds)), "logits": digest}))


def _run(copy: str, args) -> dict:
    env = dict(os.environ, PYTHONPATH=copy)
    cmd = [sys.executable, __file__, "--child", args.model, "--prompt", str(args.prompt),
           "--passes", str(args.passes), "--threads", str(args.threads)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd="/")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("copies", nargs="*")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        _child(args.model, args.prompt, args.passes, args.threads)
        return
    results: dict[str, list[dict]] = {c: [] for c in args.copies}
    print(f"load average {os.getloadavg()[0]:.2f}; pp{args.prompt}, {args.threads} thread(s), CPU time")
    for _ in range(args.rounds):
        for copy in args.copies:
            results[copy].append(_run(copy, args))
    for copy, runs in results.items():
        best = float(np.median([r["best"] for r in runs]))
        print(f"{copy:28s} median of bests {1e3 * best:8.1f} ms = {args.prompt / best:6.1f} t/s; "
              f"best {args.prompt / min(r['best'] for r in runs):6.1f} t/s; logits {runs[-1]['logits']}")
    digests = {r["logits"] for runs in results.values() for r in runs}
    print(f"same logits bits across copies: {len(digests) == 1}")


if __name__ == "__main__":
    main()
