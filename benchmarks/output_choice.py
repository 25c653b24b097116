"""How often the output layer's measured choice shortlists, and what each way costs (issue 23).

Usage: PYTHONPATH=. .venv/bin/python benchmarks/output_choice.py MODEL THREADS ROUNDS

In one process, rounds alternating between the choice as it was (`Old`: the calling thread's CPU
time, each way probed 8 times in a row) and as it is (kinetic/runtime/output_layer.FasterOfTwo: the
wall clock, the ways in turn), each round with a fresh choice runs 128 greedy decode steps from BOS
with top 1 (as `kinetic bench`'s tg128; token 1 where no BOS is added) and prints one JSON line:
the steps shortlisted, tg tokens a second, the load average, and for each way (sl: Shortlist,
full: the full graph) the fastest and the median of the calling thread's CPU time and of the wall
clock, in ms. Every step's logits are exact either way, so only speed differs.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from kinetic.model import Model
from kinetic.runtime.output_layer import FasterOfTwo


class Old(FasterOfTwo):
    """The choice before the wall clock: the calling thread's CPU time, 8 probes of each in a row."""

    START = FasterOfTwo.PROBES
    clock = staticmethod(time.thread_time)

    def pick(self) -> bool:
        self.calls += 1
        for way in (True, False):
            if len(self.recent[way]) < self.PROBES:
                return way
        faster = min(self.recent[True]) <= min(self.recent[False])
        return (not faster) if self.calls % self.EXPLORE == 0 else faster


def timed(passes: list, run, way: bool):
    """`run` (one way's pass) recording (way, caller CPU seconds, wall seconds) into `passes`."""
    def call(*args):
        cpu, wall = time.thread_time(), time.perf_counter()
        result = run(*args)
        passes.append((way, time.thread_time() - cpu, time.perf_counter() - wall))
        return result
    return call


def one_round(engine, bos: int, choice: FasterOfTwo, passes: list) -> dict:
    engine.output.choices.clear()
    engine.output.choices[1] = choice
    seq = engine.new_sequence()
    logits = engine.prefill(seq, [bos], top=1)
    passes.clear()
    began = time.perf_counter()
    for _ in range(128):
        logits = engine.decode(seq, int(np.argmax(logits)), top=1)
    seconds = time.perf_counter() - began
    ways = np.array([p[0] for p in passes])
    times = np.array([p[1:] for p in passes])
    line = {"kind": type(choice).__name__, "shortlisted": int(ways.sum()), "tg": round(128 / seconds, 1),
            "load": open("/proc/loadavg").read().split()[0]}
    for way, label in ((True, "sl"), (False, "full")):
        mine = times[ways == way]
        if len(mine):
            line[label] = {clock: [round(float(f(mine[:, i])) * 1e3, 2) for f in (np.min, np.median)]
                           for i, clock in enumerate(("cpu", "wall"))}
    return line


def main(name: str, threads: int, rounds: int) -> None:
    model = Model(name, threads=threads, warm_start=False, draft=False)
    engine, passes = model.engine, []
    output = engine.output
    output._shortlist_pass = timed(passes, output._shortlist_pass, True)
    output._full_pass = timed(passes, output._full_pass, False)
    bos = (model.tokenize("", add_special=True) or [1])[0]  # BOS where the model adds one, as tg128
    engine.decode(engine.new_sequence(), bos, top=1)  # compiles or loads the kernels
    for r in range(rounds):
        print(json.dumps(one_round(engine, bos, Old() if r % 2 == 0 else FasterOfTwo(), passes)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
