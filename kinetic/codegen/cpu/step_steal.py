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

Exactness: the same instructions, kernels and splits as the columns plan of the step's own tape, so
a pass gives the same bits whichever tape runs it (tests/codegen/cpu/test_step_steal.py).
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
ACTIVE_STRIDE = 8  # int64 words between two sets' counts (a cache line each)


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
        self.plan = plan
        self.held = builder.held  # the weights whose addresses the tapes hold
        self.ops = np.array([ins.op for ins in plan.instrs], np.int64)
        self.counts = np.zeros(ARENA_SETS * ACTIVE_STRIDE, np.int64)
        self.sets = [self._arena_set(plan, flags, i) for i in range(ARENA_SETS)]
        self.floats = encode(plan, self.sets[0].arenas).floats
        self.counters = PhaseCounters(len(plan.instrs), builder.threads)
        self.waits = 0  # passes that found every set still worked in (and waited)
        self._next = 0

    def _arena_set(self, plan: Plan, flags: np.ndarray, index: int) -> ArenaSet:
        every_buffer = [key for ins in plan.instrs for key in ins.writes]
        arenas = allocate(plan, every_buffer)  # kept to the end: no buffer reused
        rows = encode(plan, arenas).columns
        rows[:, tape.FLAGS] |= flags
        return ArenaSet(arenas, rows, self.counts.ctypes.data + 8 * ACTIVE_STRIDE * index)

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
