"""The compiled step's plan: instructions in, barriers, buffers and tape rows out.

Owns: the instruction record the lowering produces (`Instr`, with `Ref`s to buffers not yet placed,
collected in a `Plan`), and the three steps that turn a plan into what the driver runs: the barrier
plan (`place_barriers`, after `align_columns`), the buffer plan (`allocate`: the liveness rules of
one float32 arena and one byte arena, reused only across a barrier) and the encoding (`encode`: the
row split, rows split and columns split tapes, the float tape and the segments between Python ops). Does
not own which node becomes which instructions (lowering.py), the row layout (tape.py), nor how
buffers are chosen (kinetic/codegen/common/buffers.py, shared with Vulkan).

Three plans of one tape, the second and third each with the first's barriers and its own:

* row split (a pass of many rows, e.g. a prompt chunk: matmuls too split the rows, each share every
  column of its rows, so a layer's matmuls, norms, activations, rotary and KV stores run as one
  phase and only attention, which reads other rows' keys, stands between barriers);
* rows (a pass of at least as many rows as threads: row-local ops split the rows, matmuls their
  output columns, so the weights are read once a pass however few rows it has);
* columns (fewer rows, e.g. decode: row-local ops split columns in UNIT units, and so do the
  matmuls whose readers all split that way, align_columns, so a residual add or an activation and
  its quantization share their matmul's phase).

Buffers are planned on the first (its phases), whose barriers the other two keep. Which plan a
pass runs never changes a bit: every row is computed by the same kernels whatever share computes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kinetic.codegen.common.buffers import Value, plan_buffers
from kinetic.codegen.cpu import tape

F32 = np.float32
ALIGN = 16  # floats (64 bytes) between arena buffers
BYTE_ALIGN = 64  # bytes between byte-arena buffers


@dataclass(frozen=True)
class Ref:
    """A buffer the plan places: key ("v", node id) for a node's value, ("q", node id, format) for
    its quantized form, ("c", tensor) for a constant. part: "" (its f32 arena offset), "address"
    (its f32 arena address, for a generated kernel) or q / d / e (a byte-arena buffer's address)."""

    key: tuple
    part: str = ""


def value(node) -> Ref:
    """The f32 arena buffer of a node's value."""
    return Ref(("v", node.id))


def quantized(node) -> tuple:
    """The byte-arena buffer key of a quantize node's rows."""
    return ("q", node.inputs[0], node.attrs.format)


def row_width(node) -> int:
    """Values per row of a node's [rows, width] value (0 for other shapes)."""
    return node.type.shape[1] if len(node.type.shape) == 2 else 0


def output_rows(node) -> bool:
    """Whether a node has one row per output row of the pass (shape ["R", ...]) instead of one per row."""
    return node.type.shape[0] == "R"


@dataclass(eq=False)
class Instr:
    op: int  # a tape op code, or 0 for a Python op
    args: dict = field(default_factory=dict)  # tape column -> int, or a Ref the buffer plan resolves
    floats: dict = field(default_factory=dict)  # float column -> value
    reads: tuple = ()  # buffer keys
    writes: tuple = ()
    row_local: bool = False
    output_rows: bool = False
    python: object = None  # callable(step, n, n_out) for Python ops
    barrier: bool = False
    phase: int = 0  # in the row split plan, whose phases the buffer plan follows
    split_barrier: bool = False
    # a row-local op's split across threads when a pass has fewer rows than threads (and a matmul's
    # that align_columns gave one): columns in units of `unit` floats of a row `width` wide;
    # whole_row: it reads all of its input's row
    width: int = 0
    unit: int = 0
    whole_row: bool = False
    column_barrier: bool = False
    column_args: dict | None = None  # tape column -> value, replacing args in the columns split tape


@dataclass
class Plan:
    instrs: list[Instr] = field(default_factory=list)
    f32_sizes: dict = field(default_factory=dict)  # key -> floats
    q_sizes: dict = field(default_factory=dict)  # key -> (q bytes, d bytes, e bytes)
    constants: dict = field(default_factory=dict)  # key -> f32 values


def align_columns(plan: Plan, threads: int = 1) -> None:
    """Let an op that only feeds an activation quantization split its columns in the
    quantization's blocks, so the columns plan needs no barrier between them (the split of an
    elementwise op or of an RMS norm over whole rows is free to choose); then let a matmul whose
    output only feeds ops of one column split (an activation, a residual add) split its output
    columns the same way, where that split gives each of `threads` threads as many columns, so in
    the columns plan those ops share the matmul's phase (it reads whole rows of its input)."""
    producer: dict = {}
    readers: dict = {}
    for ins in plan.instrs:
        if ins.op == tape.OP_QUANT:
            src = producer.get(ins.reads[0])
            free = src is not None and (src.op in tape.ELEMENTWISE_CODES
                                        or (src.op == tape.OP_RMS_NORM and src.unit == 16))
            if free and src.width == ins.width and src.output_rows == ins.output_rows:
                src.unit = ins.unit
        for key in ins.reads:
            readers.setdefault(key, []).append(ins)
        for key in ins.writes:
            producer[key] = ins
    for ins in plan.instrs:
        if ins.op == tape.OP_MATMUL and ins.python is None:
            _align_matmul(ins, readers.get(ins.writes[0], []), threads)


def _align_matmul(ins: Instr, readers: list[Instr], threads: int) -> None:
    """Give the matmul `ins` its readers' column split (width, unit) where they all split its
    output one way, in whole units, and that split gives every thread as many units (a split that
    gave one thread more would cost the phase what it saves)."""
    n = ins.args[tape.MATMUL_N]
    units = {r.unit for r in readers}
    if not readers or len(units) != 1 or not all(
            r.row_local and not r.whole_row and r.width == n and r.output_rows == ins.output_rows for r in readers):
        return
    unit = units.pop()
    if unit > 0 and n % unit == 0 and (n // unit) % threads == 0:
        ins.width, ins.unit, ins.whole_row = n, unit, True


SPLIT, ROWS, COLUMNS = "split", "rows", "columns"  # the plans; the last two keep the first's barriers
SPLITS_ROWS = frozenset((tape.OP_MATMUL,))  # ops that split rows, not output columns, in the row split plan


def place_barriers(plan: Plan) -> None:
    """Barriers: after an op whose output (or input) a later op of the same phase touches across
    the threads' split; Python ops stand alone. Sets each instruction's phase (row split plan) and
    its split_barrier, barrier and column_barrier flags."""
    split_ends = _barriers(plan.instrs, SPLIT, [False] * len(plan.instrs))
    rows_ends = _barriers(plan.instrs, ROWS, split_ends)
    column_ends = _barriers(plan.instrs, COLUMNS, split_ends)
    for ins, split_end, rows_end, column_end in zip(plan.instrs, split_ends, rows_ends, column_ends, strict=True):
        ins.split_barrier, ins.barrier, ins.column_barrier = split_end, rows_end, column_end
    phase = 0
    for ins in plan.instrs:
        ins.phase = phase
        phase += ins.split_barrier


def _barriers(instrs: list[Instr], split: str, kept: list[bool]) -> list[bool]:
    """Per instruction, whether a barrier follows it in the plan `split`: where `kept` has one (the
    plan before it) and where the next op clashes with one of the phase so far."""
    ends = [False] * len(instrs)
    current: list[Instr] = []
    for i, ins in enumerate(instrs):
        clash = ins.python is not None or (i > 0 and kept[i - 1]) or any(_clash(p, ins, split) for p in current)
        if clash and current:
            ends[i - 1] = True
            current = []
        current.append(ins)
    return ends


def _row_local(ins: Instr, split: str) -> bool:
    """Whether `ins` splits rows (or, in the columns plan, columns in units) in the plan `split`:
    matmuls do in the row split plan (but those of the output rows, often one: an output layer
    keeps its columns split), and in the columns plan those align_columns gave a unit."""
    if ins.row_local:
        return True
    if ins.python is not None or ins.op not in SPLITS_ROWS:
        return False
    return (split == SPLIT and not ins.output_rows) or (split == COLUMNS and ins.unit > 0)


def _clash(p: Instr, ins: Instr, split: str) -> bool:
    """Whether `ins` may not run in the same phase as the earlier `p` in the plan `split`."""
    if p.python is not None:
        return True
    shared = (set(p.writes) & (set(ins.reads) | set(ins.writes))) | (set(p.reads) & set(ins.writes))
    if not shared:
        return False
    if not (_row_local(p, split) and _row_local(ins, split) and p.output_rows == ins.output_rows):
        return True
    if split != COLUMNS:
        return False
    same_split = p.unit == ins.unit and p.width == ins.width and p.unit > 0
    return not same_split or (ins.whole_row and bool(shared & set(ins.reads))) or (
        p.whole_row and bool(shared & set(p.reads)))


def steal_flags(plan: Plan) -> list[int]:
    """Per instruction, the flags that let the columns plan's phases be stolen (step_sync.py,
    "Stealing"), for a plan whose buffers are never reused (allocate with every key kept): FLAG_STEAL
    on every instruction of a phase of STEALABLE ops only, each buffer it writes written by that one
    instruction and never read by it, and FLAG_COMMIT on those of its ops with a side effect (read by
    nothing else in the phase). Any other phase keeps 0: its shares are waited for."""
    writers: dict = {}
    for ins in plan.instrs:
        for key in ins.writes:
            writers[key] = writers.get(key, 0) + 1
    flags: list[int] = []
    phase: list[Instr] = []
    for ins in plan.instrs:
        phase.append(ins)
        if ins.column_barrier or ins is plan.instrs[-1] or ins.python is not None:
            flags.extend(_phase_steal_flags(phase, writers))
            phase = []
    return flags


def _phase_steal_flags(phase: list[Instr], writers: dict) -> list[int]:
    side_effects = {key for ins in phase if ins.op in tape.COMMIT for key in ins.writes}
    stealable = all(
        ins.python is None and ins.op in tape.STEALABLE and not set(ins.reads) & set(ins.writes)
        and all(writers[key] == 1 for key in ins.writes) and not side_effects & set(ins.reads)
        for ins in phase)
    if not stealable:
        return [0] * len(phase)
    return [tape.FLAG_STEAL | (tape.FLAG_COMMIT if ins.op in tape.COMMIT else 0) for ins in phase]


@dataclass
class Arenas:
    """Where the plan's buffers live: f32 arena offsets (floats) and byte-arena offsets (q, d, e)."""

    arena: np.ndarray  # f32: constants first, then activations
    qarena: np.ndarray  # u8: quantized activations
    offsets: dict  # key -> f32 offset
    q_offsets: dict  # key -> (q, d, e) byte offsets


def allocate(plan: Plan, kept: list[tuple]) -> Arenas:
    """Both arenas through the shared planner (kinetic/codegen/common/buffers.py): each buffer a
    `Value` whose positions are the rows plan's phases, so a buffer is reused only across a barrier.
    Liveness: from the phase of a buffer's first writer to the last phase that reads or writes it
    (a buffer written by several instructions lives from the first to the last); `kept` buffers (the
    graph's outputs, read after the pass) and constants (live before the first phase: the rotary
    tables an instruction fills, the norm weights and biases) live to the end and are never reused,
    the constants first in the f32 arena. A quantized buffer's q, d and e parts are one value, each
    part aligned."""
    first: dict = {}
    last: dict = {}
    for ins in plan.instrs:
        for key in ins.writes:
            first.setdefault(key, ins.phase)
        for key in ins.reads + ins.writes:
            last[key] = ins.phase
    for key in kept:
        last[key] = None
    constants = [Value(key, 4 * values.size, -1, None) for key, values in plan.constants.items()]
    f32_values = constants + [Value(key, 4 * plan.f32_sizes[key], phase, last[key])
                              for key, phase in first.items() if key in plan.f32_sizes]
    q_parts = {key: tuple(_aligned(s, BYTE_ALIGN) for s in plan.q_sizes[key]) for key in first if key in plan.q_sizes}
    q_values = [Value(key, sum(parts), first[key], last[key]) for key, parts in q_parts.items()]
    starts, size = _arena(f32_values, 4 * ALIGN)
    offsets, top = {key: at // 4 for key, at in starts.items()}, size // 4
    starts, qtop = _arena(q_values, BYTE_ALIGN)
    q_offsets = {key: (at, at + q_parts[key][0], at + q_parts[key][0] + q_parts[key][1]) for key, at in starts.items()}
    arena = np.zeros(top + ALIGN, F32)
    for key, values in plan.constants.items():
        arena[offsets[key]: offsets[key] + values.size] = values
    return Arenas(arena, np.zeros(qtop + BYTE_ALIGN, np.uint8), offsets, q_offsets)


def _arena(values: list[Value], align: int) -> tuple[dict, int]:
    """Each value's byte offset in one arena of `values`' buffers laid end to end, and its size."""
    plan = plan_buffers(values, align)
    starts, size = plan.offsets(align)
    return {key: starts[buffer] for key, buffer in plan.buffer_of.items()}, size


def _aligned(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


@dataclass
class Tapes:
    rows: np.ndarray  # int64 [n, TAPE_WIDTH]: the rows split plan
    split: np.ndarray  # int64 [n, TAPE_WIDTH]: the row split plan (matmuls split rows; fewest barriers)
    columns: np.ndarray  # int64 [n, TAPE_WIDTH]: the columns split plan (same ops, its own barriers)
    floats: np.ndarray  # float64 [n, FLOAT_WIDTH]
    segments: list  # (start, end) of compiled runs, or a Python Instr


def encode(plan: Plan, arenas: Arenas) -> Tapes:
    """The tape rows: each instruction's arguments in its columns, Refs resolved to offsets and
    addresses."""
    rows, split_rows, column_rows, float_rows = [], [], [], []
    for ins in plan.instrs:
        if ins.python is None and set(ins.args) != set(tape.ARGUMENTS[ins.op]):
            raise AssertionError(f"tape op {tape.OP_NAMES[ins.op]}: columns {sorted(ins.args)}")
        row = [0] * tape.TAPE_WIDTH
        for column, value in ins.args.items():
            row[column] = _resolve(value, arenas)
        row[tape.OP], row[tape.WIDTH], row[tape.UNIT] = ins.op, ins.width, ins.unit
        out_rows = tape.FLAG_OUTPUT_ROWS if ins.output_rows else 0
        column_row, split_row = list(row), list(row)
        split_row[tape.FLAGS] = ((tape.FLAG_BARRIER if ins.split_barrier else 0) | out_rows
                                 | (tape.FLAG_SPLIT_ROWS if _row_local(ins, SPLIT) and not ins.row_local else 0))
        row[tape.FLAGS] = (tape.FLAG_BARRIER if ins.barrier else 0) | out_rows
        column_row[tape.FLAGS] = (tape.FLAG_BARRIER if ins.column_barrier else 0) | out_rows | tape.FLAG_COLUMNS
        for column, value in (ins.column_args or {}).items():
            column_row[column] = value
        rows.append(row)
        split_rows.append(split_row)
        column_rows.append(column_row)
        floats = [0.0] * tape.FLOAT_WIDTH
        for column, value in ins.floats.items():
            floats[column] = float(value)
        float_rows.append(floats)
    return Tapes(np.array(rows, np.int64).reshape(-1, tape.TAPE_WIDTH),
                 np.array(split_rows, np.int64).reshape(-1, tape.TAPE_WIDTH),
                 np.array(column_rows, np.int64).reshape(-1, tape.TAPE_WIDTH),
                 np.array(float_rows, np.float64).reshape(-1, tape.FLOAT_WIDTH), _segments(plan.instrs))


def _resolve(value, arenas: Arenas) -> int:
    if not isinstance(value, Ref):
        return int(value)
    if value.part == "address":  # an f32 arena buffer's address (a kernel reads it)
        return arenas.arena.ctypes.data + 4 * arenas.offsets[value.key]
    if value.part:
        return arenas.qarena.ctypes.data + arenas.q_offsets[value.key]["qde".index(value.part)]
    return arenas.offsets[value.key]


def _segments(instrs: list[Instr]) -> list:
    """(start, end) of each run of compiled instructions, and each Python instruction, in order."""
    segments: list = []
    start = None
    for i, ins in enumerate(instrs):
        if ins.python is not None:
            if start is not None:
                segments.append((start, i))
                start = None
            segments.append(ins)
        elif start is None:
            start = i
    if start is not None:
        segments.append((start, len(instrs)))
    return segments
