"""The CPU's op-to-kernel table (kinetic/codegen/cpu/lowering.py), the tape's named layout
(tape.py) and the CPU's capabilities (target.py): "unsupported" means "not in the table, or refused
by its row", the lowering fills exactly the columns the driver reads, and the declared fused ops
are ones the table lowers."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.codegen.cpu import tape
from kinetic.codegen.cpu.executor import CpuInterpreter
from kinetic.codegen.cpu.lowering import LOWERINGS, device_graph, unsupported
from kinetic.codegen.cpu.quant_blocks import LAYOUTS
from kinetic.codegen.cpu.step import CompiledStep
from kinetic.codegen.cpu.tape_plan import Arenas, Instr, Plan, Ref, allocate, encode
from kinetic.codegen.cpu.target import BIT_EXACT, CAPABILITIES
from kinetic.codegen.runner import Capabilities
from kinetic.compiler import compile_graph
from kinetic.frontend.gguf_file import open_gguf
from kinetic.ir.ops import Op
from kinetic.ir.rows import PassRows
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.synthetic import synthetic_path

TOKENS = [2, 104, 75, 82, 49, 14, 42, 30]


def _logits(engine: Engine) -> np.ndarray:
    return engine.forward(PassRows.chain(TOKENS, 0, outputs="all"), {0: engine.new_sequence()})


def test_an_op_missing_from_the_table_sends_the_graph_to_the_executor(monkeypatch):
    """A graph with an op the table has no row for is unsupported, naming the op; the CPU device
    then runs it op by op, with the reference's logits."""
    gguf = open_gguf(synthetic_path("llama"))
    graph = compile_graph(gguf)
    assert unsupported(graph) is None
    monkeypatch.delitem(LOWERINGS, Op.SWIGLU)
    assert unsupported(graph) == "swiglu has no CPU kernel"
    cpu = Engine(graph, GGUFWeights(gguf), n_ctx=32, device="cpu")
    assert not isinstance(cpu.runner, CompiledStep)
    reference = Engine(graph, GGUFWeights(gguf), n_ctx=32, device="reference")
    assert np.array_equal(_logits(cpu), _logits(reference))


def test_every_op_argument_column_lies_between_the_flags_and_the_split_columns():
    """Each op's named argument columns are distinct and sit after OP and FLAGS, before SHARES, WIDTH
    and UNIT, so no argument overwrites what the driver reads for every op."""
    assert {tape.OP, tape.FLAGS} == {0, 1}
    assert (tape.SHARES, tape.WIDTH, tape.UNIT) == tuple(range(tape.TAPE_WIDTH - 3, tape.TAPE_WIDTH))
    for code, columns in tape.ARGUMENTS.items():
        assert code in tape.OP_NAMES
        assert len(set(columns)) == len(columns) and min(columns) > tape.FLAGS and max(columns) < tape.SHARES
    assert len(set(tape.OP_NAMES)) == len(tape.OP_NAMES) and 0 not in tape.OP_NAMES  # 0: a Python op


def test_the_encoder_refuses_an_instruction_that_does_not_fill_its_ops_columns():
    """An instruction must fill exactly its op's columns: one missing is an error, not a silent 0."""
    arenas = Arenas(np.zeros(16, np.float32), np.zeros(64, np.uint8), {("v", 1): 0, ("v", 2): 0}, {})
    args = {tape.TAKE_X: Ref(("v", 1)), tape.TAKE_Y: Ref(("v", 2)), tape.TAKE_WIDTH: 8}
    rows = encode(Plan([Instr(tape.OP_TAKE_ROWS, dict(args))]), arenas).rows
    assert rows[0, tape.OP] == tape.OP_TAKE_ROWS and rows[0, tape.TAKE_WIDTH] == 8
    del args[tape.TAKE_WIDTH]
    with pytest.raises(AssertionError, match="take_rows"):
        encode(Plan([Instr(tape.OP_TAKE_ROWS, args)]), arenas)


def test_the_arenas_reuse_a_buffer_only_after_its_last_phase_and_never_an_outputs():
    """allocate: a buffer last read in phase p serves a value written in phase p + 1 or later, never
    one written in p; an output keeps its buffer; constants come first, filled; a quantized buffer's
    q, d and e parts are consecutive, each 64-byte aligned."""
    a, b, c, d, out, q, w = ("v", 1), ("v", 2), ("v", 3), ("v", 4), ("v", 5), ("q", 1, "q8_0"), ("c", "w")
    plan = Plan([Instr(1, writes=(a,), phase=0), Instr(1, reads=(a,), writes=(b, q), phase=1),
                 Instr(1, reads=(b, q), writes=(out,), phase=1), Instr(1, reads=(out,), writes=(c,), phase=2),
                 Instr(1, reads=(c,), writes=(d,), phase=3)],
                f32_sizes={key: 32 for key in (a, b, c, d, out)}, q_sizes={q: (40, 8, 0)},
                constants={w: np.arange(5, dtype=np.float32)})
    arenas = allocate(plan, [out])
    at = arenas.offsets
    assert at[w] == 0 and np.array_equal(arenas.arena[:5], np.arange(5))
    assert len({at[a], at[b], at[out]}) == 3  # live together in phase 1
    assert at[c] in (at[a], at[b]) and at[d] in (at[a], at[b]) and at[c] != at[d]
    assert at[out] not in (at[a], at[b], at[c], at[d], at[w])
    assert arenas.q_offsets[q] == (0, 64, 128)


def test_compiled_tapes_leave_every_unnamed_column_zero():
    """On a real lowering (both synthetic families), a row's non-zero columns are only OP, FLAGS,
    WIDTH, UNIT and its op's named arguments (Python ops: none but FLAGS)."""
    for family in ("llama", "gemma3"):
        gguf = open_gguf(synthetic_path(family))
        step = CompiledStep(compile_graph(gguf), GGUFWeights(gguf), threads=2, rows=4)
        for tape_rows in (step.tape, step.split_tape, step.column_tape):
            for row in tape_rows:
                named = {tape.OP, tape.FLAGS, tape.WIDTH, tape.UNIT, *tape.ARGUMENTS.get(int(row[tape.OP]), ())}
                assert not any(row[c] for c in range(tape.TAPE_WIDTH) if c not in named)


def test_the_cpu_declares_only_fused_ops_its_table_lowers():
    """CAPABILITIES has the shared shape, every fused op it declares has a row in LOWERINGS, its
    device phase makes only forms it declares (quantize nodes), and only for types with a kernel."""
    assert isinstance(CAPABILITIES, Capabilities) and CAPABILITIES.name == "cpu"
    assert CAPABILITIES.fused_ops and CAPABILITIES.fused_ops <= set(LOWERINGS)
    assert CAPABILITIES.max_rows is None
    fusions = CAPABILITIES.fusions
    assert fusions.forms() == {Op.QUANTIZE} <= CAPABILITIES.fused_ops
    assert fusions.quantized_matmuls == BIT_EXACT <= set(LAYOUTS) and not fusions.quantize_in


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_tapes_quantizations_are_the_device_graphs_quantize_nodes(family):
    """The step runs the device form of the graph it is given (ids kept); each quantize node is one
    q8 quantization on the tape, and every q8 matmul kernel reads one of them."""
    gguf = open_gguf(synthetic_path(family))
    graph = compile_graph(gguf)
    step = CompiledStep(graph, GGUFWeights(gguf), threads=2, rows=4)
    assert step.graph == device_graph(graph) != graph
    nodes = [n for n in step.graph.nodes if n.op is Op.QUANTIZE]
    quants = [i for i in step.plan.instrs if i.op == tape.OP_QUANT and i.args[tape.QUANT_BLOCK] > 1]
    assert nodes and [i.writes for i in quants] == [(("q", n.inputs[0], n.attrs.format),) for n in nodes]
    q8_matmuls = [i for i in step.plan.instrs if i.op == tape.OP_MATMUL and i.args[tape.MATMUL_D] != 0]
    assert q8_matmuls and all(i.reads[0] in {q.writes[0] for q in quants} for i in q8_matmuls)


def test_the_executor_and_the_reference_run_the_device_graph():
    """The op-by-op executor and the reference interpreter run the CPU's device form too (a quantize
    node's reference passes its rows on), with the compiled step's logits on the generic graph."""
    gguf = open_gguf(synthetic_path("llama"))
    graph = compile_graph(gguf)
    device = device_graph(graph)
    compiled = _logits(Engine(graph, GGUFWeights(gguf), n_ctx=32, device="cpu"))
    reference = Engine(device, GGUFWeights(gguf), n_ctx=32, device="reference")
    executor = Engine(device, GGUFWeights(gguf), n_ctx=32, device="reference")
    executor.runner = CpuInterpreter(GGUFWeights(gguf))
    assert np.array_equal(_logits(reference), compiled) and np.array_equal(_logits(executor), compiled)


def test_quantized_rows_for_a_type_without_a_cpu_kernel_are_refused():
    """A device graph made for another device's fusions (quantized rows read by an IQ3_S matmul, a
    type the CPU runs through the reference, which reads f32 rows) is unsupported, naming the type;
    the same matmul reading f32 rows is lowered."""
    from kinetic.ir.text import parse_graph

    text = """
%0 = input() {name="tokens"} : i32[T]
%1 = param() {tensor="token_embd.weight"} : f32[16,256]
%2 = embed(%1, %0) : f32[T,256]
%3 = param() {tensor="w"} : iq3_s[32,256]
%4 = quantize(%2) {format="q8_k"} : q8_k[T,256]
%5 = matmul(%4, %3) {activations="q8"} : f32[T,32]
output out = %5
"""
    assert unsupported(parse_graph(text)) == "a matmul of IQ3_S weights reading quantized rows"
    assert unsupported(parse_graph(text.replace("matmul(%4", "matmul(%2"))) is None
