"""Decode in the two numerics modes, A/B in one process: the same model opened in "ggml" and in
"fast" (kinetic/ir/orders.py), greedy decode steps asking for the top logit as `kinetic bench` does
(so Shortlist may serve the output layer), the modes taking turns every --burst tokens so a shared
machine's load falls on both alike. Reports each mode's median and best wall time a token over all
its bursts (a burst's time divided by its tokens), and the ratio fast / ggml in tokens per second;
and the same of the calling thread's CPU time (time.thread_time: not counting the time it was
preempted, which on a shared machine makes it the steadier figure; with one thread it is the whole
step's work, with several the calling thread's share and its spinning, not its futex sleeps).

    python benchmarks/numerics_decode_ab.py MODEL [--threads 2] [--bursts 40] [--burst 16] [--context 256]

Each mode's sequence restarts after --context tokens, so both modes decode over the same range of
cache lengths. Each burst also records how much CPU other processes took meanwhile (/proc/stat's
busy time less this process's, as a share of the machine's CPUs); the report repeats the wall-clock
figures over the bursts where that share stayed below --quiet (a shared machine's quiet moments).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from kinetic.frontend.blocks import Options
from kinetic.model import Model

TICKS = os.sysconf("SC_CLK_TCK")


def _busy_ticks() -> tuple[int, int]:
    """(the machine's busy clock ticks, every CPU summed: /proc/stat's cpu line less idle and iowait;
    this process's user and system ticks)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    with open("/proc/self/stat") as f:
        mine = f.read().rsplit(")", 1)[1].split()
    return sum(fields[:8]) - fields[3] - fields[4], int(mine[11]) + int(mine[12])


class Decoder:
    """One mode's engine and its running greedy sequence."""

    def __init__(self, model_name: str, numerics: str, threads: int, context: int):
        self.model = Model(model_name, n_ctx=context + 64, threads=threads, options=Options(numerics=numerics),
                           warm_start=False)
        self.engine = self.model.engine
        self.context = context
        self.seconds: list[float] = []
        self.cpu: list[float] = []
        self.others: list[float] = []  # per timed burst: the share of the CPUs other processes used
        self._restart()
        self.burst(32, timed=False)  # compile and settle the output layer's choice (output_layer.py)

    def _restart(self) -> None:
        self.seq = self.engine.new_sequence()
        self.logits = self.engine.prefill(self.seq, [1], top=1)
        self.done = 0

    def burst(self, tokens: int, timed: bool = True) -> None:
        if self.done + tokens > self.context:
            self._restart()
        start, cpu, busy = time.perf_counter(), time.thread_time(), _busy_ticks()
        for _ in range(tokens):
            self.logits = self.engine.decode(self.seq, int(np.argmax(self.logits)), top=1)
        if timed:
            wall = time.perf_counter() - start
            self.seconds.append(wall / tokens)
            self.cpu.append((time.thread_time() - cpu) / tokens)
            others = (_busy_ticks()[0] - busy[0]) - (_busy_ticks()[1] - busy[1])
            self.others.append(others / (wall * TICKS * (os.cpu_count() or 1)))
        self.done += tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bursts", type=int, default=40)
    ap.add_argument("--burst", type=int, default=16)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--quiet", type=float, default=0.1, help="the share of the CPUs others may take in a quiet burst")
    args = ap.parse_args()
    decoders = {mode: Decoder(args.model, mode, args.threads, args.context) for mode in ("ggml", "fast")}
    load = [os.getloadavg()[0]]
    for _ in range(args.bursts):
        for decoder in decoders.values():
            decoder.burst(args.burst)
    load.append(os.getloadavg()[0])
    print(f"{args.model}: {args.threads} threads, {args.bursts} bursts of {args.burst} tokens a mode, "
          f"load average {load[0]:.2f} -> {load[1]:.2f}")
    for clock in ("seconds", "cpu"):
        medians = {}
        print("  wall clock:" if clock == "seconds" else "  the calling thread's CPU time:")
        for mode, decoder in decoders.items():
            times = getattr(decoder, clock)
            medians[mode] = statistics.median(times)
            print(f"    {mode:5s} median {1 / medians[mode]:6.1f} t/s ({1e6 * medians[mode]:6.0f} us a token), "
                  f"best {1 / min(times):6.1f} t/s ({1e6 * min(times):6.0f} us)")
        print(f"    fast / ggml: x{medians['ggml'] / medians['fast']:.3f} (medians)")
    quiet = {mode: [t for t, o in zip(d.seconds, d.others, strict=True) if o < args.quiet]
             for mode, d in decoders.items()}
    if all(quiet.values()):
        print(f"  wall clock, bursts where others took under {100 * args.quiet:.0f} % of the CPUs:")
        for mode, times in quiet.items():
            print(f"    {mode:5s} {len(times):3d} bursts, median {1 / statistics.median(times):6.1f} t/s, "
                  f"best {1 / min(times):6.1f} t/s")
        print(f"    fast / ggml: x{statistics.median(quiet['ggml']) / statistics.median(quiet['fast']):.3f} (medians)")
    else:
        print(f"  no quiet bursts (others under {100 * args.quiet:.0f} %) in "
              + " or ".join(mode for mode, times in quiet.items() if not times))


if __name__ == "__main__":
    main()
