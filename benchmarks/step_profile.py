"""Where a forward pass's time goes in the compiled step: per op kind, the share of the calling
thread's compiled time spent working and waiting at barriers, for decode and for a prompt.

    python benchmarks/step_profile.py MODEL [--tokens 128] [--prompt 256] [--threads 2]

Decode feeds the greedy token after a one-token prompt; the prompt runs in the engine's chunks.
The Python share (embedding lookup, rotary tables, per-pass tables, sampling) is the wall time the
compiled tape does not account for.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from kinetic.codegen.cpu.native import cycle_count
from kinetic.model import Model


def _report(title: str, step, seconds: float, tokens: int, cycles: int) -> None:
    compiled = int(step.cycles.sum())
    print(f"\n{title}: {tokens / seconds:.1f} t/s; compiled tape {100 * compiled / max(cycles, 1):.0f} % of wall time")
    print(f"{'op':24s} {'count':>6s} {'work %':>7s} {'wait %':>7s}")
    for name, count, work, wait in step.profile()[:14]:
        print(f"{name:24s} {count:6d} {100 * work:7.1f} {100 * wait:7.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    model = Model(args.model, n_ctx=max(1024, args.prompt + args.tokens + 8), threads=args.threads)
    engine = model.engine
    step = engine.runner
    seq = engine.new_sequence()
    engine.prefill(seq, [1, 2, 3])  # warm up
    ids = ((np.arange(args.prompt) * 7919) % 1000 + 100).tolist()
    step.cycles[:] = 0
    seq = engine.new_sequence()
    c0, t0 = cycle_count(), time.perf_counter()
    engine.prefill(seq, ids)
    _report(f"prompt of {args.prompt}", step, time.perf_counter() - t0, args.prompt, cycle_count() - c0)
    step.cycles[:] = 0
    seq = engine.new_sequence()
    logits = engine.prefill(seq, [1])
    c0, t0 = cycle_count(), time.perf_counter()
    for _ in range(args.tokens):
        logits = engine.decode(seq, int(np.argmax(logits)))
    _report(f"decode of {args.tokens}", step, time.perf_counter() - t0, args.tokens, cycle_count() - c0)


if __name__ == "__main__":
    main()
