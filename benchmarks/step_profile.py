"""Where a forward pass's time goes in the compiled step: per op kind, the share of the calling
thread's compiled time spent working and waiting at barriers, for decode and for a prompt.

    python benchmarks/step_profile.py MODEL [--tokens 128] [--prompt 256] [--threads 2] [--repeat 1]
                                      [--no-split]

Decode feeds the greedy token after a one-token prompt; the prompt runs in the engine's chunks,
once to warm up, then --repeat times (the profile sums them; the speed is the median). Each compiled
step the engine ran passes on is profiled (the graph cut before the output layer and, where the
output layer may end the pass, the full graph), with its phases a pass in each plan. --no-split
runs prompt chunks on the rows plan instead of the row split plan (kinetic/codegen/cpu/tape_plan.py:
before and after).
The Python share (embedding lookup, rotary tables, per-pass tables, sampling) is the wall time the
compiled tape does not account for.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from kinetic.codegen.cpu import tape
from kinetic.codegen.cpu.native import cycle_count
from kinetic.model import Model


def _steps(engine) -> list:
    """The compiled steps the engine runs passes on: its runner and, where the output layer may run
    at the end of the full graph's pass (runtime/output_layer.py), that graph's step once opened."""
    full = getattr(getattr(engine, "output", None), "full", None)
    return [step for step in (engine.runner, full) if step is not None and hasattr(step, "cycles")]


def _phases(rows) -> int:
    return int(np.count_nonzero(rows[:-1, tape.FLAGS] & tape.FLAG_BARRIER)) + 1


def _report(title: str, steps: list, seconds: float, tokens: int, cycles: int) -> None:
    print(f"\n{title}: {tokens / seconds:.1f} t/s")
    for step in steps:
        compiled = int(step.cycles.sum())
        if not compiled:
            continue
        label = "graph with the output layer" if step is not steps[0] else "graph"
        print(f"{label}: compiled tape {100 * compiled / max(cycles, 1):.0f} % of wall time; phases a pass: "
              f"row split {_phases(step.split_tape)}, rows {_phases(step.tape)}, columns {_phases(step.column_tape)}")
        print(f"{'op':24s} {'count':>6s} {'work %':>7s} {'wait %':>7s}")
        for name, count, work, wait in step.profile()[:14]:
            print(f"{name:24s} {count:6d} {100 * work:7.1f} {100 * wait:7.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--no-split", action="store_true", help="prompt chunks on the rows plan (the old behaviour)")
    args = ap.parse_args()
    model = Model(args.model, n_ctx=max(1024, args.prompt + args.tokens + 8), threads=args.threads)
    engine = model.engine
    seq = engine.new_sequence()
    engine.prefill(seq, [1, 2, 3])  # warm up
    ids = ((np.arange(args.prompt) * 7919) % 1000 + 100).tolist()
    engine.prefill(engine.new_sequence(), ids)
    steps = _steps(engine)
    for step in steps:
        step.cycles[:] = 0
        if args.no_split:
            step.split_rows_from = 1 << 30
    seconds, cycles = [], 0
    for _ in range(args.repeat):
        seq = engine.new_sequence()
        c0, t0 = cycle_count(), time.perf_counter()
        engine.prefill(seq, ids)
        seconds.append(time.perf_counter() - t0)
        cycles += cycle_count() - c0
    _report(f"prompt of {args.prompt}", steps, statistics.median(seconds), args.prompt, cycles)
    steps = _steps(engine)
    for step in steps:
        step.cycles[:] = 0
    seq = engine.new_sequence()
    logits = engine.prefill(seq, [1])
    c0, t0 = cycle_count(), time.perf_counter()
    for _ in range(args.tokens):
        logits = engine.decode(seq, int(np.argmax(logits)))
    _report(f"decode of {args.tokens}", steps, time.perf_counter() - t0, args.tokens, cycle_count() - c0)


if __name__ == "__main__":
    main()
