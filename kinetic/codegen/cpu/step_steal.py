"""The compiled step's one-row tapes whose phases may be stolen (a decode step beside a busy machine).

Owns: `StealTapes`: the graph's instructions planned for one row with no buffer reused, the
columns-split tape of that plan with its stealing flags (tape_plan.steal_flags), and ARENA_SETS
arena sets it is encoded against, each with its count of threads working in it; `acquire` hands a
pass a set no thread is still working in. Does not own the stealing itself (step_sync.py,
"Stealing"; step_drive.drive) nor running a pass (step.py).

Why separate arenas: when a waiting thread takes over a share whose holder was preempted, the holder
later finishes it, writing the bits already there. That is harmless while nothing else is written
in those places, so the tape reuses no buffer, and a pass never runs in an arena a late holder may
still write into: passes alternate between arena sets, and a set is handed out only once its count
of working threads is zero (a late holder is back on its core within a time slice; the next pass
on the same set is two passes later). A one-row pass's buffers are small (a row of each node), so
keeping every buffer costs little memory; passes of more rows keep the shared arenas and wait for
a preempted holder as before.

Prefixes (`prefix_flags`): a phase of an RMS norm and an activation quantization only (or a
quantization alone) that feeds a stolen phase loses its barrier and becomes that phase's prefix
(FLAG_PREFIX): every thread runs it in full before its first share of the phase (step_drive.drive),
so no thread waits for another between the two. It is correct because every run of a prefix writes
the same bits (computed from inputs finished before the phase, never rewritten: no buffer reused)
and a thread reads the prefix's outputs only after its own run has written them, a thief included
(it runs the prefix before the stolen share unless it already has this phase). A decode layer keeps
6 of its 9 phases (SmolLM2), 8 of 11 (Gemma 3); each prefix costs the other thread its small ops
again (docs/runtime.md, "Prefixes").

Shares (`share_counts`): a phase is one share a thread, except a stolen phase whose matmuls read
many weight bytes (an output layer: Gemma 3's 178 MB, SmolLM2's 30 MB): it gets a share for about
every SHARE_BYTES of weights (tape.SHARES), claimed one at a time. With one share a thread, a thread
preempted inside the output layer held half of it: the other waited until the share was overdue
(three usual share lengths: tens of ms) and only then ran it again (beside one busy process per core,
Gemma 3's decode waited 7 of its 44 ms a token there). With small shares the other thread claims
every share but the one held and waits at most a small share's overdue time for it. A matmul's
columns are computed alike in any range (matmul_ir), so the bits do not depend on the count.

Exactness: the same instructions, kernels and splits as the columns plan of the step's own tape, so
a pass gives the same bits whichever tape runs it (tests/codegen/cpu/test_step_steal.py); a prefix
run in full is the same bits as its column shares (step_ops.run_span).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from kinetic.codegen.cpu import tape
from kinetic.codegen.cpu.lowering import TapeBuilder, lower_graph
from kinetic.codegen.cpu.step_threads import PhaseCounters
from kinetic.codegen.cpu.tape_plan import Arenas, Plan, align_columns, allocate, encode, place_barriers, steal_flags

ARENA_SETS = 2  # a pass's arena is reused two passes later
PREFIXES = True  # merge small phases into the next as prefixes (False: the old phases, for A/B runs)
ACTIVE_STRIDE = 8  # int64 words between two sets' counts (a cache line each)
SHARE_BYTES = 1 << 20  # weight bytes a share of a stolen matmul phase reads, about ("Shares" above)
MOST_SHARES = 128  # shares a phase at most (the counters hold this many a phase)


@dataclass
class ArenaSet:
    """One arena set: the arenas, the tape rows encoded against them, and where its count of
    working threads lives."""

    arenas: Arenas
    tape: np.ndarray  # int64 [n, TAPE_WIDTH]: the columns split plan with the stealing flags
    active: int  # the address of the count (int64)

    def view(self, node_id: int, width: int, rows: int) -> np.ndarray:
        """A node's value in this set's arena, f32 [rows, width]."""
        off = self.arenas.offsets[("v", node_id)]
        return self.arenas.arena[off: off + rows * width].reshape(rows, width)


class StealTapes:
    """The one-row tapes of a graph for `threads` threads (more than one) that steal."""

    def __init__(self, builder: TapeBuilder):
        plan = lower_graph(builder)
        if any(ins.python is not None for ins in plan.instrs):
            raise ValueError("a graph with Python instructions has no stealing tapes")
        align_columns(plan, builder.threads)
        place_barriers(plan)
        flags = np.array(steal_flags(plan), np.int64)
        sizes = {array.ctypes.data: array.nbytes for array in builder.held}
        self.weight_bytes = np.array([sizes.get(ins.args.get(tape.MATMUL_WEIGHT), 0) if ins.op == tape.OP_MATMUL
                                      else 0 for ins in plan.instrs], np.int64)
        self.threads = builder.threads
        self.plan = plan
        self.held = builder.held  # the weights whose addresses the tapes hold
        self.ops = np.array([ins.op for ins in plan.instrs], np.int64)
        self.counts = np.zeros(ARENA_SETS * ACTIVE_STRIDE, np.int64)
        self.sets = [self._arena_set(plan, flags, i) for i in range(ARENA_SETS)]
        self.floats = encode(plan, self.sets[0].arenas).floats
        phases = _phases(self.sets[0].tape)
        self.counters = PhaseCounters(len(phases), builder.threads,
                                      [int(self.sets[0].tape[first, tape.SHARES]) or builder.threads
                                       for first, _ in phases])
        self.waits = 0  # passes that found every set still worked in (and waited)
        self._next = 0

    def _arena_set(self, plan: Plan, flags: np.ndarray, index: int) -> ArenaSet:
        every_buffer = [key for ins in plan.instrs for key in ins.writes]
        arenas = allocate(plan, every_buffer)  # kept to the end: no buffer reused
        rows = encode(plan, arenas).columns
        rows[:, tape.FLAGS] |= flags
        if PREFIXES:
            prefix_flags(rows)
        share_counts(rows, self.weight_bytes, self.threads)
        return ArenaSet(arenas, rows, self.counts.ctypes.data + 8 * ACTIVE_STRIDE * index)

    def shares(self) -> dict[int, int]:
        """The phases given more shares than threads: {first row: shares}."""
        rows = self.sets[0].tape
        return {first: int(rows[first, tape.SHARES]) for first, _ in _phases(rows) if rows[first, tape.SHARES]}

    def prefixes(self) -> int:
        """The phases whose leading ops are a prefix."""
        flags = self.sets[0].tape[:, tape.FLAGS] & tape.FLAG_PREFIX
        return int(np.count_nonzero(flags[1:] < flags[:-1]))

    def stolen_phases(self) -> tuple[int, int]:
        """(phases that may be stolen, phases) of the tape."""
        ends = np.flatnonzero(self.sets[0].tape[:, tape.FLAGS] & tape.FLAG_BARRIER).tolist()
        ends = ends if ends and ends[-1] == len(self.ops) - 1 else ends + [len(self.ops) - 1]
        steal = self.sets[0].tape[ends, tape.FLAGS] & tape.FLAG_STEAL
        return int(np.count_nonzero(steal)), len(ends)

    def acquire(self) -> ArenaSet:
        """The next arena set no thread is working in (waiting, rarely, for a late holder to leave)."""
        waited = False
        while True:
            for k in range(ARENA_SETS):
                i = (self._next + k) % ARENA_SETS
                if self.counts[i * ACTIVE_STRIDE] == 0:
                    self._next = i + 1
                    self.waits += waited
                    return self.sets[i]
            waited = True
            time.sleep(0)


def _phases(rows: np.ndarray) -> list[tuple[int, int]]:
    """(first row, last row) of each phase of a tape, cut at its barrier flags."""
    ends = np.flatnonzero(rows[:, tape.FLAGS] & tape.FLAG_BARRIER).tolist()
    starts = [0] + [end + 1 for end in ends]
    return [(s, e) for s, e in zip(starts, ends + [len(rows) - 1], strict=True) if s <= e]


def share_counts(rows: np.ndarray, weight_bytes: np.ndarray, threads: int) -> None:
    """Give each stolen phase whose matmuls read more than SHARE_BYTES a thread more shares: threads
    times the power of two that brings a share to SHARE_BYTES or less (MOST_SHARES at most), in
    tape.SHARES on every row of the phase ("Shares" above). `rows`: a stealing tape's int rows,
    changed in place; `weight_bytes`: per row, the weight bytes its matmul reads (0 for other ops)."""
    for first, last in _phases(rows):
        if not all(rows[i, tape.FLAGS] & tape.FLAG_STEAL for i in range(first, last + 1)):
            continue
        total, shares = int(weight_bytes[first: last + 1].sum()), threads
        while total > shares * SHARE_BYTES and 2 * shares <= MOST_SHARES:
            shares *= 2
        if shares > threads:
            rows[first: last + 1, tape.SHARES] = shares


def prefix_flags(rows: np.ndarray) -> None:
    """Make each stolen phase of PREFIX_OPS only, column-split, the prefix of the stolen phase after it
    where that one holds a matmul: FLAG_PREFIX on its rows, its end barrier removed.
    `rows`: a stealing tape's int rows, changed in place ("Prefixes" above)."""
    flags = rows[:, tape.FLAGS]
    bounds = _phases(rows)
    for (first, last), (after, until) in zip(bounds, bounds[1:], strict=False):
        small = all(rows[i, tape.OP] in tape.PREFIX_OPS and flags[i] & tape.FLAG_STEAL and flags[i] & tape.FLAG_COLUMNS
                    and not flags[i] & tape.FLAG_COMMIT for i in range(first, last + 1))
        body = any(rows[i, tape.OP] == tape.OP_MATMUL for i in range(after, until + 1))
        if small and body and all(flags[i] & tape.FLAG_STEAL for i in range(after, until + 1)):
            flags[first: last + 1] |= tape.FLAG_PREFIX
            flags[last] &= ~tape.FLAG_BARRIER
