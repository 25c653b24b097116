"""The compiled step: a graph turned into one tape that compiled code runs once per forward pass.

Owns: `CompiledStep`, the CPU's in-place runner: building (the graph after the CPU's device phase,
lowering.device_graph, through the op-to-kernel table in lowering.py, then the barrier and buffer
plans and the tape rows in tape_plan.py) and running a pass (the per-pass tables of pass_tables.py,
the compiled segments on every thread through step_threads.py, Python ops in between), and
`profile()`, where a pass's time went. Python runs per pass only the embedding lookup of tables the
tape does not read, the per-pass tables (with a rotary table that has YaRN or frequency factors: the
shared host table) and, between compiled segments, any op no kernel covers (a matmul of a type
without a bit-exact kernel goes through the reference), so every file runs. Does
not own the row layout (tape.py), what an op computes (step_ops.py) nor the kernels
(step_kernels.py). `available_cpus` (step_threads.py) is read from here too, as the default thread
count.

Plan of a pass: every thread walks the same tape. Row-local ops (norms, rotary, activations,
residual adds, the quantize nodes' activation quantization, KV stores) split the rows, and
consecutive row-local ops need no barrier between them; matmuls split output columns and attention
splits (row, head) pairs, so a barrier separates them from what reads their output. Consecutive
independent matmuls (q/k/v, gate/up, reading one quantize node) share one phase with no barrier
between them, which is what concatenating their weights would buy, without copying them: scheduling,
not a fusion (the graph keeps one node per matmul). Buffers are reused only across a barrier. A
pass of many rows a thread (a prompt chunk) runs the row split plan instead, where matmuls split
the rows too, so only attention stands between barriers, and its phases are cut into more shares
than threads (`_tape_for`, `_shares`; tape_plan.py has the three plans).

Exactness: each op repeats the reference's floats for each row on its own (kinetic.ir.numerics), so
the step gives the reference interpreter's logits bit for bit, for any batch, grouping or thread
count (tests/codegen/cpu/test_cpu_step.py).
"""

from __future__ import annotations

import threading

import numpy as np

from kinetic.codegen.cpu import tape
from kinetic.codegen.cpu.lowering import TapeBuilder, device_graph, lower_graph, step_layers
from kinetic.codegen.cpu.matmul_choice import MatmulChoice
from kinetic.codegen.cpu.native import cycle_count
from kinetic.codegen.cpu.pass_tables import PassTables
from kinetic.codegen.cpu.step_kernels import StepKernels
from kinetic.codegen.cpu.step_steal import StealTapes
from kinetic.codegen.cpu.step_threads import Contention, PhaseCounters, available_cpus, run_parallel
from kinetic.codegen.cpu.tape_plan import align_columns, allocate, encode, place_barriers
from kinetic.errors import KineticError
from kinetic.ir import numerics
from kinetic.ir.graph import Graph
from kinetic.ir.interpreter import Interpreter, WeightSource
from kinetic.ir.rows import KVView, PassResult, PassRows

SPLIT_ROWS_FROM = 8  # rows a thread from which a pass runs the row split plan (below it a row share costs more
#                     than a column share: measured for SmolLM2 Q4_1, 4 rows a thread 2.2x, 8 the same)
SHARES_A_THREAD = 4  # a row split pass's shares a thread, at most (rows permitting)


class CompiledStep:
    """Runs a graph's forward passes through one compiled tape; writes K/V into the caches in place.
    `graph` is the generic graph or its device form; `self.graph` is the device form (same ids)."""

    in_place = True

    def __init__(self, graph: Graph, weights: WeightSource, *, threads: int | None = None, rows: int = 64,
                 matmul: MatmulChoice | None = None):
        self.graph = graph = device_graph(graph)  # the device phase: ids kept, quantize nodes added
        self.weights = weights
        self.threads = max(1, threads or available_cpus())
        self.reference = Interpreter(weights)  # weights of Python ops, dequantized once
        self.kernels = StepKernels(matmul)  # `matmul`: the kernels' tile and wide paths (a profile's; same bits)
        self.gelu = numerics.gelu_table().astype(np.float32)
        self.layers = step_layers(graph)
        self.contention = Contention(self.threads)
        self.split_rows_from = SPLIT_ROWS_FROM
        self._lock = threading.Lock()  # a step's buffers serve one pass at a time
        self._outputs = [(name, node_id, graph.node(node_id).type.shape[0] == "R") for name, node_id in graph.outputs]
        self._build(rows)
        self.steal = self._steal_tapes()

    def _build(self, rows: int) -> None:
        """The tape for passes of up to `rows` rows: lowered, barriers placed, buffers planned, encoded."""
        builder = TapeBuilder(self.graph, self.weights, self.reference, self.kernels, rows, self.threads)
        plan = lower_graph(builder)
        align_columns(plan, self.threads)
        place_barriers(plan)
        arenas = allocate(plan, [("v", node_id) for _name, node_id in self.graph.outputs])
        tapes = encode(plan, arenas)
        self.capacity = rows
        self.plan = plan
        self._held = builder.held  # the weights whose addresses the tape holds
        self._vocab = builder.vocab  # rows of the embedding table the tape reads by token id
        self.arena, self.qarena = arenas.arena, arenas.qarena
        self.offsets, self.q_offsets = arenas.offsets, arenas.q_offsets
        self.tape, self.split_tape, self.column_tape, self.ftape = tapes.rows, tapes.split, tapes.columns, tapes.floats
        self.segments = tapes.segments
        self.cycles = np.zeros((len(plan.instrs), 2), np.int64)  # per op: cycles working, cycles waiting
        self.phase_counters = PhaseCounters(len(self.tape), self.threads)  # at most one phase per row

    def _steal_tapes(self) -> StealTapes | None:
        """One-row passes' tapes whose phases may be stolen (step_steal.py), where there are several
        threads and the tape runs no Python instruction."""
        if self.threads == 1 or any(not isinstance(seg, tuple) for seg in self.segments):
            return None
        steal = StealTapes(TapeBuilder(self.graph, self.weights, self.reference, self.kernels, 1, self.threads))
        if not np.array_equal(steal.ops, self.tape[:, tape.OP]):  # profile() names rows by self.tape
            raise AssertionError("the one-row tape's instructions differ from the step's")
        return steal

    # -- running ----------------------------------------------------------------------------------

    def run(self, graph: Graph, rows: PassRows, caches: KVView) -> PassResult:
        with self._lock:
            return self._run(rows, caches)

    def close(self) -> None:
        """Nothing to free on a device: the arenas go with the step, the worker threads serve the process."""

    def view(self, node_id: int, rows: int) -> np.ndarray:
        """A node's value in the arena, f32 [rows, width]."""
        width = self.graph.node(node_id).type.shape[1]
        off = self.offsets[("v", node_id)]
        return self.arena[off: off + rows * width].reshape(rows, width)

    def _run(self, rows: PassRows, caches: KVView) -> PassResult:
        n = len(rows.tokens)
        if n > self.capacity:
            self._build(max(n, 2 * self.capacity))
        n_out = len(rows.output_rows)
        self.pass_rows = rows
        self.pass_caches, self.new_state = caches, {}  # recurrent ops read states and add each row's
        tables = PassTables(rows, caches, self.layers)
        positions = rows.positions.astype(np.int32, copy=False)
        tokens = rows.tokens.astype(np.int32, copy=False)
        low, high = (tokens[0], tokens[0]) if n == 1 else (tokens.min(initial=0), tokens.max(initial=0))
        if not (0 <= low and high < self._vocab):  # the embedding reads its table by token id
            raise KineticError(f"a token id is outside the vocabulary (0..{self._vocab - 1})",
                               "Check the token ids of the prompt.")
        common = (self.arena, self.arena.ctypes.data, n, n_out, rows.output_rows.astype(np.int32, copy=False),
                  tokens, positions,
                  tables.row_slot, tables.row_cidx, tables.slot_rows, tables.anc, tables.kv_addr, tables.clen,
                  tables.cpos_addr, self.gelu)
        if n == 1 and self.steal is not None:
            return self._run_stealing(rows, caches, n_out, common[2:])
        threads = self.contention.threads_now()
        tape_now = self._tape_for(n, threads)
        shares = self._shares(n, threads) if tape_now is self.split_tape else threads
        begin, waited = cycle_count(), 0
        for seg in self.segments:
            if isinstance(seg, tuple):
                waited += run_parallel(tape_now, self.ftape, seg, threads, common, self.phase_counters, self.cycles,
                                       shares=shares)
            else:
                seg.python(self, n, n_out)
        if threads > 1:
            self.contention.record(waited, cycle_count() - begin)
        outputs = {name: self.view(node_id, n_out if per_output else n).copy()
                   for name, node_id, per_output in self._outputs}
        return PassResult(outputs, {}, self.new_state)

    def _tape_for(self, n: int, threads: int) -> np.ndarray:
        """The plan a pass of n rows runs on `threads` threads (tape_plan.py): columns split below one
        row a thread, row split from `split_rows_from` rows a thread and twice as many as threads
        (the pass has a fifth of the barriers, but each thread reads every weight: the guard keeps
        that traffic, threads times the weights, small beside the pass's work, rows times them),
        rows split in between."""
        if n < threads:
            return self.column_tape
        return self.split_tape if n >= max(self.split_rows_from, 2 * threads) * threads else self.tape

    def _shares(self, n: int, threads: int) -> int:
        """Shares of a row split pass's phases: `threads`, or where the rows allow, up to
        SHARES_A_THREAD a thread of at least split_rows_from rows each, so a thread that another
        process holds back leaves its unclaimed shares to the others (the shares are claimed as they
        come, step_sync.claim), instead of holding every phase up."""
        if threads == 1:
            return 1
        return max(threads, min(SHARES_A_THREAD * threads, n // self.split_rows_from))

    def _run_stealing(self, rows: PassRows, caches: KVView, n_out: int, tables: tuple) -> PassResult:
        """A one-row pass on every thread through the stealing tapes (step_steal.py), whatever the
        contention: a thread off its core holds no phase up for long."""
        steal = self.steal
        chosen = steal.acquire()
        arena = chosen.arenas.arena
        keep = (steal, chosen, caches.sequence(int(rows.seqs[0])))  # what a late share may still read
        run_parallel(chosen.tape, steal.floats, (0, len(chosen.tape)), self.threads,
                     (arena, arena.ctypes.data) + tables, steal.counters, self.cycles, chosen.active, keep)
        outputs = {name: chosen.view(node_id, self.graph.node(node_id).type.shape[1], n_out if per_output else 1).copy()
                   for name, node_id, per_output in self._outputs}
        return PassResult(outputs, {}, self.new_state)

    # -- where the time goes ----------------------------------------------------------------------

    def profile(self) -> list[tuple[str, int, float, float]]:
        """Where the calling thread's time went since the step was built: (op, count, share of the
        compiled time working, share waiting at its barriers), largest first. Matmuls are named by
        their output width."""
        total = max(int(self.cycles.sum()), 1)
        work: dict[str, list] = {}
        for i, row in enumerate(self.tape):
            name = tape.OP_NAMES[int(row[tape.OP])] if row[tape.OP] else "python"
            if row[tape.OP] == tape.OP_MATMUL:
                name += f" N={row[tape.MATMUL_N]}"
            entry = work.setdefault(name, [0, 0, 0])
            entry[0] += 1
            entry[1] += int(self.cycles[i, 0])
            entry[2] += int(self.cycles[i, 1])
        rows = [(k, v[0], v[1] / total, v[2] / total) for k, v in work.items()]
        return sorted(rows, key=lambda r: -(r[2] + r[3]))
