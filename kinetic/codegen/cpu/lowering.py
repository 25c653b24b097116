"""The CPU's op-to-kernel table: how each graph op becomes instructions of the compiled step's tape.

Owns: `LOWERINGS` (Op -> `OpLowering`: the function that turns one node into its tape instructions,
and the check that refuses a node it cannot lower, with the reason), `unsupported(graph)` ("an op
not in the table, or a node its row refuses"), `device_graph`, the graph the compiled step runs
(after the device phase with the CPU's fusions, target.FUSIONS), and `lower_graph`, which walks
that graph through the table into a `Plan`. Leaves (inputs, weights, cache handles) produce no
instructions: the runtime binds them and their readers take their addresses. Does not own the row
layout (tape.py), barriers and buffers (tape_plan.py), the kernels (step_kernels.py) nor what an
op computes (step_ops.py).

Adding an op: its kernel (a tape op code in tape.py and its case in step_ops.run_op, or a generated
kernel), then one row here. A node the tape has no kernel for, yet must run (a matmul of a weight
type without a bit-exact kernel), becomes a Python instruction that runs the reference between
compiled segments. Ops the table lacks or refuses send the whole graph to the op-by-op executor
(runner.py).

The one fusion the CPU declares is in the IR: the device phase gives the q8 matmuls of the exact
weight types (target.BIT_EXACT) a `quantize` node, one per row and format shared by every matmul
that reads it (kinetic/passes/device_fusion.py); its row is one OP_QUANT, and a matmul reads
the quantize node's bytes. F16 / BF16 matmuls still round a row once for all of them (the IR's
quantize formats are the q8 ones). The matmul and quantize rows are matmul_ops.py's; the MoE,
recurrent and encoder ops' rows are in moe_ops.py, recurrent_ops.py and encoder_ops.py. That
consecutive independent matmuls (q/k/v, gate/up) share one barrier phase is scheduling, not a fusion
(tape_plan.place_barriers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.common.orders import refused_order
from kinetic.codegen.common.tables import RopeTables
from kinetic.codegen.cpu import encoder_ops, matmul_ops, moe_ops, recurrent_ops, tape, target
from kinetic.codegen.cpu.step_kernels import StepKernels
from kinetic.codegen.cpu.tape_plan import Instr, Plan, Ref, output_rows, row_width, value
from kinetic.errors import KineticError
from kinetic.ir import numerics
from kinetic.ir import reference as ref
from kinetic.ir.graph import Graph, Node
from kinetic.ir.interpreter import Interpreter, WeightSource
from kinetic.ir.numerics.attention import f16_cache_accumulator
from kinetic.ir.ops import LEAVES, Op
from kinetic.ir.quants import dequantize_rows
from kinetic.passes.pipeline import lower_for_device

F32 = np.float32
EMBED_KINDS = {Q.Q8_0: tape.EMBED_Q8_0, Q.F16: tape.EMBED_F16, Q.F32: tape.EMBED_F32}  # tables the tape reads
ELEMENTWISE = {Op.ADD: tape.OP_ADD, Op.MUL: tape.OP_MUL, Op.SCALE: tape.OP_SCALE, Op.SILU: tape.OP_SILU,
               Op.GELU: tape.OP_GELU, Op.SOFTCAP: tape.OP_SOFTCAP, Op.SWIGLU: tape.OP_SWIGLU,
               Op.GEGLU: tape.OP_GEGLU}


class TapeBuilder:
    """One graph's instructions for buffers of `capacity` rows, and what they hold on to."""

    def __init__(self, graph: Graph, weights: WeightSource, reference: Interpreter, kernels: StepKernels,
                 capacity: int, threads: int):
        self.graph, self.weights, self.reference, self.kernels = graph, weights, reference, kernels
        self.capacity, self.threads = capacity, threads
        self.plan = Plan()
        self.layer_index = {layer: i for i, layer in enumerate(step_layers(graph))}
        self.held: list[np.ndarray] = []  # arrays whose addresses the tape holds
        self.vocab = 1 << 62  # rows of the embedding table the tape reads (set when it reads one)
        self.rounded: set = set()  # ("q", node id, format): a row already rounded for float matmuls
        self.rope_tables: dict = {}  # RopeAttrs.rotary -> buffer key prefix

    def address(self, array: np.ndarray) -> int:
        """`array`'s address, kept alive as long as the tape."""
        self.held.append(array)
        return array.ctypes.data

    def add(self, op: int, args: dict, **fields) -> None:
        self.plan.instrs.append(Instr(op, args, **fields))

    def add_python(self, run: Callable, **fields) -> None:
        """An op the tape runs through Python between compiled segments: run(step, n, n_out)."""
        self.plan.instrs.append(Instr(0, python=run, **fields))


def step_layers(graph: Graph) -> list[int]:
    """The layers whose caches the graph reads, in order (the tape's layer indexes)."""
    return sorted({n.attrs.layer for n in graph.nodes if n.op is Op.STATE})


@dataclass(frozen=True)
class OpLowering:
    """One row of the table: emit(builder, node, inputs) appends the node's instructions;
    refuse(graph, node) says why it cannot (None: it can)."""

    emit: Callable[[TapeBuilder, Node, list[Node]], None]
    refuse: Callable[[Graph, Node], str | None] = lambda graph, node: None


def device_graph(graph: Graph) -> Graph:
    """The graph the compiled step runs: `graph` after the device phase with the CPU's fusions (ids
    kept; a quantize node before the q8 matmuls of the exact types). Idempotent."""
    return lower_for_device(graph, target.FUSIONS)


def unsupported(graph: Graph) -> str | None:
    """Why the compiled step cannot run this graph (None: it can): the first node whose op has no
    row in LOWERINGS, or whose row refuses it, or a reduction in an order no kernel follows. The
    same for the graph and its device_graph: the phase adds only quantize nodes, which every q8
    format's row lowers."""
    for node in graph.nodes:
        if node.op in LEAVES:
            continue
        if node.op not in LOWERINGS:
            return f"{node.op.value} has no CPU kernel"
        reason = LOWERINGS[node.op].refuse(graph, node)
        if reason:
            return reason
    return refused_order(graph, target.CAPABILITIES.reduction_orders, "compiled CPU step",
                         target.CAPABILITIES.numerics)


def lower_graph(builder: TapeBuilder) -> Plan:
    """Every node through its row of the table, after the rotary tables (first on the tape)."""
    g, plan = builder.graph, builder.plan
    _rope_tables(builder)
    for node in g.nodes:
        if node.op is Op.INPUT and node.type.dtype == "f32":  # rows the pass brings (PassRows.hidden)
            _input_rows(builder, node)
        if node.op in LEAVES:
            continue
        if node.op not in LOWERINGS:
            raise KineticError(f"the compiled step has no lowering for {node.op.value}", "Use --device reference.")
        if node.type.dtype == "f32" and len(node.type.shape) == 2:
            plan.f32_sizes[("v", node.id)] = builder.capacity * node.type.shape[1]
        LOWERINGS[node.op].emit(builder, node, [g.node(i) for i in node.inputs])
    return plan


def _input_rows(b: TapeBuilder, node: Node) -> None:
    """An f32 input (a prediction block's `hidden.<width>` rows): copied into its buffer by Python."""
    b.plan.f32_sizes[("v", node.id)] = b.capacity * node.type.shape[1]
    name = node.attrs.name

    def run(step, n: int, n_out: int) -> None:
        step.view(node.id, n)[:] = step.pass_rows.input(name)

    b.add_python(run, writes=(("v", node.id),))


def _rope_tables(b: TapeBuilder) -> None:
    """One instruction per distinct rotary table: each row's angles (numerics.rope_angles) and their
    cosines and sines through the C library's cosf / sinf. A plain or linearly scaled table is
    computed in the compiled step; one with YaRN, frequency factors or a magnitude (rare, and the
    same positions' values every pass) is the shared host table (common/tables.py) copied in by a
    Python instruction, so its arithmetic is written once for every device."""
    for node in b.graph.nodes:
        if node.op is not Op.ROPE:
            continue
        a = node.attrs
        if a.rotary in b.rope_tables:
            continue
        table = b.rope_tables[a.rotary] = ("rope", len(b.rope_tables))
        half = a.n_rot // 2
        for part in ("angles", "cos", "sin"):
            b.plan.constants[table + (part,)] = np.zeros(b.capacity * half, F32)
        if not a.rotary.plain:
            b.add_python(_python_rope_table(RopeTables(a.rotary), table), writes=(table + ("cos",), table + ("sin",)))
            continue
        # ggml's theta_scale = powf(base, -2/n_rot), the C library's (numerics.rope_angles)
        step = numerics.powf(a.theta, F32(-2.0) / F32(a.n_rot))
        b.add(tape.OP_ROPE_TABLE, {
            tape.TABLE_ANGLES: Ref(table + ("angles",)), tape.TABLE_COS: Ref(table + ("cos",)),
            tape.TABLE_SIN: Ref(table + ("sin",)), tape.TABLE_HALF: half,
            tape.TABLE_COSF: b.kernels.libm("cosf"), tape.TABLE_SINF: b.kernels.libm("sinf")},
            floats={tape.TABLE_STEP: step, tape.TABLE_FREQ_SCALE: F32(a.freq_scale)},
            writes=(table + ("angles",), table + ("cos",), table + ("sin",)), row_local=True, width=half, unit=half)


# ---- the rows of the table ----------------------------------------------------------------------

def _embed(b: TapeBuilder, node: Node, ins: list[Node]) -> None:
    table, width = ins[0], row_width(node)
    if ins[1].op is not Op.INPUT or ins[1].attrs.name != "tokens":  # positions, token types (encoder_ops)
        encoder_ops.embed_by_input(b, node, table, ins[1])
        return
    if table.type.ggml_type not in EMBED_KINDS:  # dequantized by Python before the tape
        b.add_python(_python_embed(table, node, b.weights), writes=(("v", node.id),))
        return
    raw = np.ascontiguousarray(b.weights.tensor(table.attrs.tensor))
    b.vocab = raw.shape[0]
    b.add(tape.OP_EMBED, {tape.EMBED_TABLE: b.address(raw), tape.EMBED_ROW_BYTES: raw.strides[0],
                          tape.EMBED_Y: value(node), tape.EMBED_WIDTH: width,
                          tape.EMBED_KIND: EMBED_KINDS[table.type.ggml_type]},
          writes=(("v", node.id),), row_local=True, width=width, unit=32)


def _rms_norm(b: TapeBuilder, node: Node, ins: list[Node]) -> None:
    a, width = node.attrs, row_width(node)
    weight, weight_size = -1, 0
    if len(ins) == 2:
        values = b.reference.weight(ins[1]).values.reshape(-1).astype(F32)
        ckey = ("c", ins[1].attrs.tensor)
        b.plan.constants[ckey] = values
        weight, weight_size = Ref(ckey), values.size
    b.add(tape.OP_RMS_NORM, {
        tape.RMS_X: value(ins[0]), tape.RMS_Y: value(node), tape.RMS_WIDTH: width,
        tape.RMS_GROUP: a.group or width, tape.RMS_WEIGHT: weight, tape.RMS_WEIGHT_SIZE: weight_size},
        floats={tape.RMS_EPS: F32(a.eps)}, reads=(("v", ins[0].id),), writes=(("v", node.id),), row_local=True,
        output_rows=output_rows(node), width=width, unit=16 if not a.group or a.group == width else a.group,
        whole_row=True)


def _add_bias(b: TapeBuilder, node: Node, ins: list[Node]) -> None:
    """x + the bias on every row: the bias a constant of the arena, the add the elementwise kernel's."""
    width, ckey = row_width(node), ("c", ins[1].attrs.tensor)
    b.plan.constants[ckey] = b.reference.weight(ins[1]).values.reshape(-1).astype(F32)
    b.add(tape.OP_ADD_BIAS, {tape.BIAS_X: value(ins[0]), tape.BIAS_B: Ref(ckey), tape.BIAS_Y: value(node),
                             tape.BIAS_WIDTH: width},
          reads=(("v", ins[0].id),), writes=(("v", node.id),), row_local=True, output_rows=output_rows(node),
          width=width, unit=16)


def _refuse_rms_norm(graph: Graph, node: Node) -> str | None:
    if len(node.inputs) == 2 and graph.node(node.inputs[1]).op is not Op.PARAM:
        return "an rms_norm weight computed in the graph"
    return None


def _rope(b: TapeBuilder, node: Node, ins: list[Node]) -> None:
    a = node.attrs
    table = b.rope_tables[a.rotary]
    b.add(tape.OP_ROPE, {
        tape.ROPE_X: value(ins[0]), tape.ROPE_Y: value(node), tape.ROPE_N_HEAD: a.n_head,
        tape.ROPE_HEAD_DIM: a.head_dim, tape.ROPE_N_ROT: a.n_rot, tape.ROPE_NEOX: int(a.neox),
        tape.ROPE_COS: Ref(table + ("cos",)), tape.ROPE_SIN: Ref(table + ("sin",))},
        reads=(("v", ins[0].id), table + ("cos",), table + ("sin",)), writes=(("v", node.id),), row_local=True,
        output_rows=output_rows(node), width=a.n_head * a.head_dim, unit=a.head_dim)


def _attention(b: TapeBuilder, node: Node, ins: list[Node]) -> None:
    """The keys and values stored into the cache in place (split as rotary splits the keys), then
    attention over it."""
    a = node.attrs
    layer = b.layer_index[ins[3].attrs.layer]
    kv_width = a.n_kv_head * a.head_dim
    b.add(tape.OP_KV_STORE, {tape.KV_K: value(ins[1]), tape.KV_V: value(ins[2]), tape.KV_WIDTH: kv_width,
                             tape.KV_LAYER: layer},
          reads=(("v", ins[1].id), ("v", ins[2].id)), writes=(("kv", layer),), row_local=True,
          width=kv_width, unit=a.head_dim)
    if a.softcap:
        scale, cap = F32(F32(a.scale) / F32(a.softcap)), F32(a.softcap)
    else:
        scale, cap = F32(a.scale), F32(0)
    shape = (a.n_head // a.n_kv_head, a.n_kv_head, a.head_dim, bool(a.softcap))
    accumulator = f16_cache_accumulator(a)  # the node's order: "key_chain_f16" or "key_chain_f16_acc32"
    # passes of several rows (prompts, drafts) give every thread rows: tiles of rows times the query
    # heads of a KV head (step_attention.attend_tiles), or for one row an item of all those heads,
    # widening each key and value once for all of them; a pass of fewer rows than threads splits the
    # heads as the threads need (the columns plan, no tiles)
    rows_plan = (*b.kernels.attention(*shape, threads=1, accumulator=accumulator),
                 b.kernels.attention_tile(a.head_dim, bool(a.softcap), accumulator=accumulator))
    columns_plan = (*b.kernels.attention(*shape, threads=b.threads, accumulator=accumulator), 0)
    kernel_columns = (tape.ATTEND_SCORE_KERNEL, tape.ATTEND_SOFTMAX_KERNEL, tape.ATTEND_HEADS,
                      tape.ATTEND_TILE_KERNEL)
    b.add(tape.OP_ATTEND, {
        tape.ATTEND_Q: value(ins[0]), tape.ATTEND_Y: value(node), tape.ATTEND_LAYER: layer,
        tape.ATTEND_N_HEAD: a.n_head, tape.ATTEND_N_KV_HEAD: a.n_kv_head, tape.ATTEND_HEAD_DIM: a.head_dim,
        tape.ATTEND_WINDOW: a.window, **dict(zip(kernel_columns, rows_plan, strict=True)),
        tape.ATTEND_SCALE_BITS: _f32_bits(scale), tape.ATTEND_CAP_BITS: _f32_bits(cap),
        tape.ATTEND_F32_ACC: int(accumulator == "f32")},
        floats={tape.ATTEND_SCALE: scale, tape.ATTEND_CAP: cap}, reads=(("v", ins[0].id), ("kv", layer)),
        writes=(("v", node.id),), column_args=dict(zip(kernel_columns, columns_plan, strict=True)))


def _refuse_attention(graph: Graph, node: Node) -> str | None:
    return f"a {node.attrs.kv_dtype} KV cache" if node.attrs.kv_dtype != "f16" else None


def _take_rows(b: TapeBuilder, node: Node, ins: list[Node]) -> None:
    b.add(tape.OP_TAKE_ROWS, {tape.TAKE_X: value(ins[0]), tape.TAKE_Y: value(node), tape.TAKE_WIDTH: row_width(node)},
          reads=(("v", ins[0].id),), writes=(("v", node.id),), output_rows=True)


def _columns(b: TapeBuilder, node: Node, ins: list[Node]) -> None:
    """A range of each row's values, copied (row-local: a column split covers the output's columns)."""
    width = row_width(node)
    b.add(tape.OP_COLUMNS, {tape.COLS_X: value(ins[0]), tape.COLS_Y: value(node), tape.COLS_X_WIDTH: row_width(ins[0]),
                            tape.COLS_START: node.attrs.start},
          reads=(("v", ins[0].id),), writes=(("v", node.id),), row_local=True, output_rows=output_rows(node),
          width=width, unit=16)


def _elementwise(b: TapeBuilder, node: Node, ins: list[Node]) -> None:
    a, width = node.attrs, row_width(node)
    floats = {}
    if node.op is Op.SCALE:
        floats = {tape.SCALE_FACTOR: F32(a.factor)}
    elif node.op is Op.SOFTCAP:
        floats = {tape.SOFTCAP_CAP: F32(a.cap), tape.SOFTCAP_INVERSE: F32(F32(1) / F32(a.cap))}
    b.add(ELEMENTWISE[node.op], {tape.EW_X: value(ins[0]), tape.EW_B: value(ins[1]) if len(ins) == 2 else 0,
                                 tape.EW_Y: value(node), tape.EW_WIDTH: width},
          floats=floats, reads=tuple(("v", i.id) for i in ins), writes=(("v", node.id),), row_local=True,
          output_rows=output_rows(node), width=width, unit=16)


LOWERINGS: dict[Op, OpLowering] = {
    Op.EMBED: OpLowering(_embed),
    Op.MATMUL: OpLowering(matmul_ops.matmul, matmul_ops.refuse_matmul),
    Op.QUANTIZE: OpLowering(matmul_ops.quantize),
    Op.TAKE_ROWS: OpLowering(_take_rows),
    Op.COLUMNS: OpLowering(_columns),
    Op.RMS_NORM: OpLowering(_rms_norm, _refuse_rms_norm),
    Op.ROPE: OpLowering(_rope),
    Op.ATTENTION: OpLowering(_attention, _refuse_attention),
    **{op: OpLowering(_elementwise) for op in ELEMENTWISE},
    Op.ADD_BIAS: OpLowering(_add_bias),
    Op.LAYER_NORM: OpLowering(encoder_ops.layer_norm, encoder_ops.refuse_layer_norm),
    Op.SHORT_CONV: OpLowering(recurrent_ops.short_conv),  # Python instructions (no generated kernels yet)
    Op.SSM_SCAN: OpLowering(recurrent_ops.ssm_scan),
    Op.DELTA_RULE: OpLowering(recurrent_ops.delta_rule),
    Op.HEAD_COLUMNS: OpLowering(recurrent_ops.head_columns),
    Op.CONCAT: OpLowering(recurrent_ops.row_local(ref.concat)),
    Op.SIGMOID: OpLowering(recurrent_ops.sigmoid),
    Op.MOE_GATE: OpLowering(moe_ops.moe_gate),  # generated row kernels; expert products native (moe_step.py)
    Op.MOE_SELECT: OpLowering(moe_ops.moe_select),
    Op.MOE_WEIGHTS: OpLowering(moe_ops.moe_weights),
    Op.MOE_MATMUL: OpLowering(moe_ops.moe_matmul),
    Op.MOE_SUM: OpLowering(moe_ops.moe_sum),
}


# ---- Python instructions: ops the tape has no kernel for -------------------------------------------

def _python_rope_table(tables: RopeTables, table: tuple):
    def run(step, n: int, n_out: int) -> None:
        cos, sin = tables.rows(np.asarray(step.pass_rows.positions))  # f32 [n, n_rot/2]
        for part, values in (("cos", cos), ("sin", sin)):
            at = step.offsets[table + (part,)]
            step.arena[at: at + values.size] = values.reshape(-1)

    return run


def _python_embed(table: Node, node: Node, weights: WeightSource):
    raw = weights.tensor(table.attrs.tensor)

    def run(step, n: int, n_out: int) -> None:
        rows = dequantize_rows(raw, table.type.ggml_type, step.pass_rows.tokens)
        step.view(node.id, n)[:] = rows.reshape(n, -1)

    return run


def _f32_bits(x) -> int:
    return int(np.float32(x).view(np.uint32))
