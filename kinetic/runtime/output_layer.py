"""Where a pass's output layer runs when Shortlist can serve it: at the end of the compiled pass, or
after it through Shortlist's head, whichever has lately been faster.

Owns: `OutputLayer`, which the engine holds where Shortlist can serve the graph (docs/shortlist.md):
per pass, either the runner of the full graph, whose compiled pass ends with the output layer (its
threads already at work, no Python between the last layer and the logits), or the runner of the
graph cut before that layer followed by Shortlist's head (exact logits for the rows that can win,
kinetic/codegen/cpu/shortlist.py); and `FasterOfTwo`, the measured choice between the two. Does not
own the head, which requests may shortlist (shortlist.py), nor what a pass commits (engine.py).

Which way a pass takes:
* no output rows (a prompt chunk before the last): the cut graph (the full one would add nothing);
* no part that may shortlist (top 0: every logit needed): the full graph;
* otherwise the faster of the two by measurement on the wall clock (what the caller waits for; not
  the calling thread's CPU time, which misses the shares other threads ran: FasterOfTwo), kept apart
  per count of output rows (a pass of 8 draft rows scans the copy 8 times but reads the full layer
  once: its costs say nothing of one row's).
Both ways give every logit a request reads bit for bit (the full graph's logits come from the layer's
own kernel, which the head runs on every row it scores exactly), so the choice changes only speed.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np

from kinetic.codegen.runner import Runner
from kinetic.ir.graph import Graph
from kinetic.ir.rows import KVView, PassResult, PassRows

MANY_ROWS = 8  # passes of this many output rows or more share one measured choice


class FasterOfTwo:
    """Which of two exact ways is faster here, by measurement: the two are tried in turn until each
    has START times, then the one whose fastest of its last PROBES times is lower runs, and the other
    is tried again every EXPLORE calls, so a change of load, of context length or of how many rows
    pass the bound is followed.

    Times are the wall clock's (`clock`, time.perf_counter: what the caller waits for, read in well
    under a microsecond), the fastest of a few, not their mean: on a shared machine a call that was
    descheduled is only ever slower, so the fastest of a few filters it out. Not the calling thread's
    CPU time (as before): the compiled pass's threads steal a late thread's shares, so when the caller
    was off its core or asleep at a barrier, a worker ran the pass and the caller's CPU time counted
    little of it (Gemma 3, 2 threads, loaded machine: the full graph's fastest caller time 1.8-5.8 ms
    against 21-27 ms of wall time, so the choice kept the full 178 MB layer on a varying share of
    steps though the shortlist was faster on the clock). Nor the process's CPU time: reading it while
    other threads run took milliseconds on a loaded 2-vCPU machine."""

    START = 4  # times of each way before the first choice (the slower way's probes cost a step each)
    PROBES = 8  # the last times kept of each way
    EXPLORE = 16
    clock = staticmethod(time.perf_counter)

    def __init__(self):
        self.recent = {True: deque(maxlen=self.PROBES), False: deque(maxlen=self.PROBES)}
        self.calls = 0

    def pick(self) -> bool:
        self.calls += 1
        if min(len(self.recent[True]), len(self.recent[False])) < self.START:
            return len(self.recent[True]) <= len(self.recent[False])  # in turn: a change of load hits both
        faster = min(self.recent[True]) <= min(self.recent[False])
        return (not faster) if self.calls % self.EXPLORE == 0 else faster

    def record(self, way: bool, seconds: float) -> None:
        self.recent[way].append(seconds)


class OutputLayer:
    """A graph's output layer on the CPU, run in its compiled pass or by Shortlist's head (`head`,
    an OutputHead) after the pass of the graph cut before it (`cut`, `cut_graph`). The full graph's
    runner is opened by `open_full` on the first pass that takes it."""

    def __init__(self, head, cut: Runner, cut_graph: Graph, full_graph: Graph, open_full: Callable[[], Runner]):
        self.head = head
        self.cut, self.cut_graph = cut, cut_graph
        self.full_graph = full_graph
        self._open_full = open_full
        self.full: Runner | None = None
        self.n_vocab = full_graph.output("logits").type.shape[1]
        self.choices: dict[int, FasterOfTwo] = {}  # min(output rows, MANY_ROWS) -> its measured choice
        self.adaptive = True  # False: shortlist whenever a pass may (tests), whatever it costs

    def run(self, rows: PassRows, caches: KVView, tops: list[tuple[int, int]]) -> tuple[PassResult, np.ndarray]:
        """One pass and its logits, f32 [output rows, n_vocab]. `tops`: each part's (output rows, top),
        in the order of the pass's output rows (top > 0: only the logits that can be among the part's
        `top` best need be exact, SeqRows.top)."""
        n_out = len(rows.output_rows)
        if n_out == 0:
            return self.cut.run(self.cut_graph, rows, caches), np.empty((0, self.n_vocab), np.float32)
        if not any(top > 0 and n > 0 for n, top in tops):
            return self._full_pass(rows, caches)
        if not self.adaptive:
            return self._shortlist_pass(rows, caches, tops)
        choice = self.choices.setdefault(min(n_out, MANY_ROWS), FasterOfTwo())
        shortlisting = choice.pick()
        self._prepare(shortlisting)  # a first use (opening the runner, loading the copy) is not timed
        began = choice.clock()
        ran = self._shortlist_pass(rows, caches, tops) if shortlisting else self._full_pass(rows, caches)
        choice.record(shortlisting, choice.clock() - began)
        return ran

    def close(self) -> None:
        if self.full is not None:
            self.full.close()

    def _prepare(self, shortlisting: bool) -> None:
        if shortlisting:
            self.head.prepare()
        elif self.full is None:
            self.full = self._open_full()

    def _full_pass(self, rows: PassRows, caches: KVView) -> tuple[PassResult, np.ndarray]:
        """The full graph: the output layer is the compiled pass's last phase."""
        self._prepare(False)
        result = self.full.run(self.full_graph, rows, caches)
        return result, result.outputs["logits"]

    def _shortlist_pass(self, rows: PassRows, caches: KVView,
                        tops: list[tuple[int, int]]) -> tuple[PassResult, np.ndarray]:
        """The cut graph, then the head on each part's hidden rows (f32 [its output rows, K]) with its top."""
        result = self.cut.run(self.cut_graph, rows, caches)
        hidden = result.outputs["hidden"]
        if len(tops) == 1:
            return result, self.head.logits(hidden, tops[0][1])
        ends = np.cumsum([n for n, _ in tops])
        parts = [self.head.logits(hidden[end - n:end], top) for (n, top), end in zip(tops, ends, strict=True)]
        return result, np.concatenate(parts)
