"""Where a forward pass's time goes in the compiled step: per op kind, the share of the calling
thread's compiled time spent working and waiting at barriers, for decode and for a prompt.

    python benchmarks/step_profile.py MODEL [--tokens 128] [--prompt 256] [--threads 2] [--repeat 1]
                                      [--no-split] [--numerics ggml|fast] [--skip-prompt] [--top 1]

Decode feeds the greedy token after a one-token prompt, asking for the --top logits as kinetic bench
does (so the output layer may go through Shortlist, kinetic/runtime/output_layer.py); the prompt runs
in the engine's chunks, once to warm up, then --repeat times (the profile sums them; the speed is the
median). Each compiled step the engine ran passes on is profiled (the graph cut before the output
layer and, where the output layer may end the pass, the full graph), with its phases a pass in each
plan, in microseconds a token as well as shares; decode adds per op kind the median over its tokens
and the sum of each instruction's least time, which a shared machine disturbs less (--threads 1). --no-split
runs prompt chunks on the rows plan instead of the row split plan (kinetic/codegen/cpu/tape_plan.py:
before and after). --numerics compiles the graph in that mode (kinetic/ir/orders.py); --skip-prompt
profiles decode only.
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
from kinetic.frontend.blocks import Options
from kinetic.ir.orders import NUMERICS
from kinetic.model import Model


def _steps(engine) -> list:
    """The compiled steps the engine runs passes on: its runner and, where the output layer may run
    at the end of the full graph's pass (runtime/output_layer.py), that graph's step once opened."""
    full = getattr(getattr(engine, "output", None), "full", None)
    return [step for step in (engine.runner, full) if step is not None and hasattr(step, "cycles")]


def _phases(rows) -> int:
    return int(np.count_nonzero(rows[:-1, tape.FLAGS] & tape.FLAG_BARRIER)) + 1


def _report(title: str, steps: list, seconds: float, tokens: int, cycles: int, head: dict | None = None) -> None:
    """Per op kind: count a pass, and the calling thread's time working and waiting at its barriers,
    in microseconds a token (cycles at the rate the timed loop measured) and as a share of the wall."""
    print(f"\n{title}: {tokens / seconds:.1f} t/s, {1e6 * seconds / tokens:.0f} us a token")
    us_per_cycle = 1e6 * seconds / max(cycles, 1) / tokens
    for step in steps:
        compiled = int(step.cycles.sum())
        if not compiled:
            continue
        label = "graph with the output layer" if step is not steps[0] else "graph"
        print(f"{label}: compiled tape {100 * compiled / max(cycles, 1):.0f} % of wall time "
              f"({compiled * us_per_cycle:.0f} us a token); phases a pass: row split {_phases(step.split_tape)}, "
              f"rows {_phases(step.tape)}, columns {_phases(step.column_tape)}")
        print(f"{'op':24s} {'count':>6s} {'work us':>8s} {'wait us':>8s} {'work %':>7s} {'wait %':>7s}")
        for name, count, work, wait in step.profile()[:14]:
            print(f"{name:24s} {count:6d} {work * compiled * us_per_cycle:8.1f} {wait * compiled * us_per_cycle:8.1f} "
                  f"{100 * work:7.1f} {100 * wait:7.1f}")
    if head and head["calls"]:
        print(f"Shortlist's head: {head['calls']} of {tokens} tokens, {1e6 * head['seconds'] / tokens:.0f} us a token "
              f"(wall; {1e6 * head['seconds'] / head['calls']:.0f} us a call)")


def _timed_head(engine) -> dict:
    """Wraps the engine's Shortlist head (where it has one) to sum its calls' wall time."""
    timing = {"calls": 0, "seconds": 0.0}
    output = getattr(engine, "output", None)
    if output is None or getattr(output, "head", None) is None:
        return timing
    logits = output.head.logits

    def timed(hidden, top):
        t0 = time.perf_counter()
        try:
            return logits(hidden, top)
        finally:
            timing["calls"] += 1
            timing["seconds"] += time.perf_counter() - t0

    output.head.logits = timed
    return timing


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--no-split", action="store_true", help="prompt chunks on the rows plan (the old behaviour)")
    ap.add_argument("--numerics", choices=NUMERICS, default=None, help="the numerics mode [default: the default's]")
    ap.add_argument("--top", type=int, default=1,
                    help="decode asks for the top N logits, as kinetic bench does (1); 0 for every logit")
    ap.add_argument("--skip-prompt", action="store_true", help="profile decode only")
    args = ap.parse_args()
    model = Model(args.model, n_ctx=max(1024, args.prompt + args.tokens + 8), threads=args.threads,
                  options=Options(numerics=args.numerics))
    engine = model.engine
    seq = engine.new_sequence()
    engine.prefill(seq, [1, 2, 3])  # warm up
    if not args.skip_prompt:
        _profile_prompt(engine, args)
    _profile_decode(engine, args)


def _profile_prompt(engine, args) -> None:
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


def _profile_decode(engine, args) -> None:
    seq = engine.new_sequence()
    logits = engine.prefill(seq, [1], top=args.top)
    for _ in range(8):  # warm up the decode steps (and the output layer's choice of way)
        logits = engine.decode(seq, int(np.argmax(logits)), top=args.top)
    steps = _steps(engine)
    for step in steps:
        step.cycles[:] = 0
    head = _timed_head(engine)
    per_token = {id(step): [] for step in steps}  # per step: the cycles of each token that ran it
    c0, t0 = cycle_count(), time.perf_counter()
    for _ in range(args.tokens):
        before = [step.cycles.copy() for step in steps]
        logits = engine.decode(seq, int(np.argmax(logits)), top=args.top)
        for step, was in zip(steps, before, strict=True):
            if (step.cycles != was).any():
                per_token[id(step)].append(step.cycles - was)
    seconds, cycles = time.perf_counter() - t0, cycle_count() - c0
    _report(f"decode of {args.tokens}", steps, seconds, args.tokens, cycles, head)
    _report_medians(steps, per_token, 1e6 * seconds / max(cycles, 1))


def _report_medians(steps: list, per_token: dict, us_per_cycle: float) -> None:
    """Per op kind, over the tokens that ran a step: the median of each token's working cycles, and
    the sum over the kind's instructions of each one's least cycles (less noisy than the sums on a
    shared machine: a token whose share was preempted is one sample; the least is the cost without
    preemption, on a cache as warm as the best token found it)."""
    for step in steps:
        samples = per_token[id(step)]
        if not samples:
            continue
        names = [_op_name(row) for row in step.tape]
        work = np.stack([sample[:, 0] for sample in samples])  # [tokens, instructions]
        least = work.min(axis=0)
        rows = []
        for kind in set(names):
            at = [i for i, n in enumerate(names) if n == kind]
            rows.append((kind, np.median(work[:, at].sum(axis=1)), least[at].sum()))
        label = "graph with the output layer" if step is not steps[0] else "graph"
        print(f"{label}, over its {len(samples)} tokens: median {np.median(work.sum(axis=1)) * us_per_cycle:.0f} us "
              f"working a token, least {least.sum() * us_per_cycle:.0f} us (per op, summed)")
        print(f"  {'op':24s} {'median us':>9s} {'least us':>9s}")
        for kind, median, low in sorted(rows, key=lambda r: -r[2])[:14]:
            print(f"  {kind:24s} {median * us_per_cycle:9.1f} {low * us_per_cycle:9.1f}")


def _op_name(row) -> str:
    name = tape.OP_NAMES[int(row[tape.OP])] if row[tape.OP] else "python"
    return name + (f" N={row[tape.MATMUL_N]}" if row[tape.OP] == tape.OP_MATMUL else "")

if __name__ == "__main__":
    main()
