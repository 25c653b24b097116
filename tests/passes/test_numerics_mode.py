"""The numerics mode through the pipeline: the batch-invariance pass writes the fast mode's orders
("block_chain" for the q8 matmuls of FAST_BLOCK_CHAIN weights) or ggml's, the mode is part of the
pipeline's options and hash, the reference interpreter computes the order a node names, and
`kinetic compile --numerics` reaches the graph (--dump-ir) and the .ktc file."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.ir.graph import Graph
from kinetic.ir.interpreter import Interpreter
from kinetic.ir.ops import Op, VerifyError
from kinetic.ir.orders import DEFAULT_NUMERICS
from kinetic.ir.rows import PassRows
from kinetic.ir.text import parse_graph
from kinetic.passes import PassOptions, pipeline_hash, run_pipeline
from kinetic.passes.batch_invariance import assign_reduction_orders
from tests.passes.conftest import EmptyKV, RandomWeights

LAYER = """
%0 = input() {name="tokens"} : i32[T]
%1 = param() {tensor="token_embd.weight"} : f32[16,64]
%2 = embed(%1, %0) : f32[T,64]
%3 = param() {tensor="norm"} : f32[64]
%4 = rms_norm(%2, %3) {eps=1e-05ORDER_NORM} : f32[T,64]
%5 = param() {tensor="w8"} : q8_0[32,64]
%6 = matmul(%4, %5) {activations="q8"ORDER_Q8_0} : f32[T,32]
%7 = param() {tensor="w41"} : q4_1[32,64]
%8 = matmul(%4, %7) {activations="q8"ORDER_Q4_1} : f32[T,32]
%9 = param() {tensor="w40"} : q4_0[32,64]
%10 = matmul(%4, %9) {activations="q8"ORDER_Q4_0} : f32[T,32]
%11 = param() {tensor="wf"} : f32[32,64]
%12 = matmul(%4, %11) {activations="q8"ORDER_F32} : f32[T,32]
%13 = matmul(%4, %5) {activations="f32"ORDER_FLOAT_PATH} : f32[T,32]
%14 = add(%6, %8) : f32[T,32]
%15 = add(%14, %10) : f32[T,32]
%16 = add(%15, %12) : f32[T,32]
%17 = add(%16, %13) : f32[T,32]
output out = %17
"""
GGML = {"NORM": "f64_sum", "Q8_0": "lanes8", "Q4_1": "lanes8", "Q4_0": "block_chain", "F32": "lanes64",
        "FLOAT_PATH": "dequant_matvec"}
FAST = {**GGML, "Q8_0": "block_chain", "Q4_1": "block_chain"}
MODE_ORDERS = {"ggml": GGML, "fast": FAST}


def layer(orders: dict[str, str] | None = None) -> str:
    text = LAYER
    for key in GGML:
        text = text.replace(f"ORDER_{key}", f', order="{orders[key]}"' if orders else "")
    return text


def test_the_pass_writes_each_modes_orders():
    """ggml mode: lanes8 for Q8_0 / Q4_1, block_chain for Q4_0; fast mode: block_chain for all three;
    both: lanes64 for F32 weights, dequant_matvec on the float path, f64_sum for the norm; no mode
    named: DEFAULT_NUMERICS's."""
    graph = parse_graph(layer())
    assert assign_reduction_orders(graph) == parse_graph(layer(MODE_ORDERS[DEFAULT_NUMERICS]))
    assert assign_reduction_orders(graph, "ggml") == parse_graph(layer(GGML))
    assert assign_reduction_orders(graph, "fast") == parse_graph(layer(FAST))


def test_the_pass_is_idempotent_and_a_second_mode_replaces_the_first():
    """Assigning a mode's orders again changes nothing; the other mode's pass rewrites them to its own."""
    fast = assign_reduction_orders(parse_graph(layer()), "fast")
    assert assign_reduction_orders(fast, "fast") == fast
    assert assign_reduction_orders(fast, "ggml") == parse_graph(layer(GGML))


def test_an_unknown_mode_is_refused():
    """A mode that is not one of orders.NUMERICS stops the batch-invariance pass, and so the pipeline,
    naming it (the users' check is kinetic/numerics_mode.py's, tests/cli/test_numerics_flag.py)."""
    with pytest.raises(VerifyError, match="unknown numerics mode 'quick'"):
        run_pipeline(parse_graph(layer()), PassOptions(numerics="quick"))
    with pytest.raises(ValueError, match="quick"):
        assign_reduction_orders(parse_graph(layer()), "quick")


def matmul_orders(graph: Graph) -> dict[tuple[str, str], str]:
    """(weight tensor, activations) -> order, for every matmul of the graph."""
    return {(graph.node(n.inputs[1]).attrs.tensor, n.attrs.activations): n.attrs.order
            for n in graph.nodes if n.op is Op.MATMUL}


def test_the_pipeline_runs_in_its_options_mode_and_hashes_it():
    """run_pipeline with numerics="fast" ends in the fast orders, with "ggml" in ggml's, without a
    mode in DEFAULT_NUMERICS's; the two modes' pipeline hashes differ (a stored graph of one is never
    taken for the other)."""
    graph = parse_graph(layer())
    fast = matmul_orders(run_pipeline(graph, PassOptions(numerics="fast")))
    ggml = matmul_orders(run_pipeline(graph, PassOptions(numerics="ggml")))
    assert fast["w8", "q8"] == "block_chain" and ggml["w8", "q8"] == "lanes8"
    assert fast["w8", "f32"] == ggml["w8", "f32"] == "dequant_matvec"
    assert matmul_orders(run_pipeline(graph)) == {"fast": fast, "ggml": ggml}[DEFAULT_NUMERICS]
    assert pipeline_hash(PassOptions(numerics="fast")) != pipeline_hash(PassOptions(numerics="ggml"))
    assert pipeline_hash(PassOptions(numerics=DEFAULT_NUMERICS)) == pipeline_hash()


def test_the_reference_computes_the_order_a_node_names():
    """The interpreter on the fast graph gives the Q8_0 matmul's block_chain result (numerics.matmul
    with that order), on the ggml graph its lanes8 result; the two differ in some last bit."""
    from kinetic.ir import numerics

    graph = parse_graph(layer())
    weights = RandomWeights(graph, seed=3)
    rows = PassRows.chain(np.arange(9) % 16, 0, outputs="all")
    outputs = {}
    for mode in ("ggml", "fast"):
        g = assign_reduction_orders(graph, mode)
        g = Graph(g.nodes, (("q8", 6),), g.meta)
        outputs[mode] = Interpreter(weights).run(g, rows, EmptyKV(g)).outputs["q8"]
    x = Interpreter(weights).run(Graph(graph.nodes, (("x", 4),), graph.meta), rows, EmptyKV(graph)).outputs["x"]
    w = numerics.DequantizedWeight(weights.tensor("w8"), graph.node(5).type.ggml_type)
    assert np.array_equal(outputs["fast"], numerics.matmul(x, w, order="block_chain"))
    assert np.array_equal(outputs["ggml"], numerics.matmul(x, w))
    assert not np.array_equal(outputs["fast"], outputs["ggml"])
