"""Vulkan's op-to-kernel table (kinetic/codegen/vulkan/kernels.py) is the one statement of what the
device runs: `unsupported` refuses exactly the ops without a row, the nodes a row refuses and the
reductions in an order no kernel follows. Needs no Vulkan device."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kinetic.codegen.runner import Capabilities
from kinetic.codegen.vulkan import kernels
from kinetic.codegen.vulkan.kernels import CAPABILITIES, KERNELS, REDUCTION_ORDERS, unsupported
from kinetic.ir.ops import ELEMENTWISE, LEAVES, OPS, Op
from kinetic.ir.orders import ORDERS
from kinetic.ir.text import parse_graph
from kinetic.passes import PassOptions, run_pipeline
from tests.conftest import device_passes

GRAPH = """
%0 = input() {name="tokens"} : i32[T]
%1 = input() {name="output_rows"} : i32[R]
%2 = param() {tensor="token_embd.weight"} : q8_0[24,64]
%3 = embed(%2, %0) : f32[T,64]
%4 = param() {tensor="norm"} : f32[64]
%5 = rms_norm(%3, %4) {eps=1e-05} : f32[T,64]
%6 = param() {tensor="w"} : q4_1[32,64]
%7 = matmul(%5, %6) {activations="q8"} : f32[T,32]
%8 = silu(%7) : f32[T,32]
%9 = take_rows(%8, %1) : f32[R,32]
output logits = %9
"""


@pytest.fixture
def graph():
    """In ggml's numerics mode whatever the default: Vulkan follows no other mode's orders."""
    return run_pipeline(parse_graph(GRAPH), PassOptions(numerics="ggml"))


def with_node(graph, node_id: int, **changes):
    """The graph with one node's fields changed, bypassing the verifier (a graph a device may be given)."""
    return replace(graph, nodes=tuple(replace(n, **changes) if n.id == node_id else n for n in graph.nodes))


def test_a_graph_whose_ops_all_have_rows_is_accepted(graph):
    """Every op of the graph has a row and no row refuses its node: nothing to say."""
    assert unsupported(graph) is None


@pytest.mark.parametrize("op", [Op.RMS_NORM, Op.SILU, Op.TAKE_ROWS])
def test_an_op_without_a_row_is_refused_by_name(graph, monkeypatch, op):
    """Taking an op's row out of KERNELS is all it takes for Vulkan to refuse it: no other list of
    handled ops exists."""
    monkeypatch.delitem(KERNELS, op)
    assert unsupported(graph) == f"{op.value} has no Vulkan kernel yet"


def test_a_row_refuses_a_node_its_kernel_does_not_cover(graph):
    """The matmul row refuses f32 activations and weight types without a kernel, naming them."""
    assert "f32 activations" in unsupported(with_node(graph, 7, attrs=replace(graph.node(7).attrs,
                                                                              activations="f32", order="")))
    iq4_xs = replace(graph.node(6).type, dtype="iq4_xs")
    assert "IQ4_XS weights" in unsupported(with_node(graph, 6, type=iq4_xs))


def test_a_reduction_in_an_order_no_kernel_follows_is_refused(graph):
    """Batch invariance: a reduction whose order attribute is not among REDUCTION_ORDERS is refused
    naming the order, and every declared order is one kinetic/ir/orders.py defines."""
    assert REDUCTION_ORDERS <= set(ORDERS)
    other = next(o for o in ORDERS if o not in REDUCTION_ORDERS)
    reason = unsupported(with_node(graph, 5, attrs=replace(graph.node(5).attrs, order=other)))
    assert reason is not None and repr(other) in reason


def test_the_table_covers_the_leaves_and_elementwise_ops_of_the_families():
    """Every leaf and every elementwise op has a row, and every row is an op of the IR."""
    assert set(KERNELS) <= set(OPS)
    assert LEAVES <= set(KERNELS)
    assert ELEMENTWISE <= set(KERNELS)


def test_capabilities_are_the_runner_contracts_and_list_only_rows_of_the_table():
    """CAPABILITIES is the shared record (kinetic/codegen/runner.py) and names no fused op without a
    row in KERNELS."""
    assert isinstance(CAPABILITIES, Capabilities) and CAPABILITIES.name == "vulkan"
    assert CAPABILITIES.fused_ops <= set(KERNELS) & kernels.DEVICE_FORMS


MOE_GRAPH = """
%0 = input() {name="tokens"} : i32[T]
%2 = param() {tensor="token_embd.weight"} : q8_0[24,64]
%3 = embed(%2, %0) : f32[T,64]
%4 = param() {tensor="router"} : f32[4,64]
%5 = matmul(%3, %4) {activations="q8"} : f32[T,4]
%6 = moe_gate(%5) {gating="softmax"} : f32[T,4]
%7 = moe_select(%6) {n_used=2} : i32[T,2]
%8 = moe_weights(%6, %7) {normalize=true, scale=0.0} : f32[T,2]
%9 = param() {tensor="down_exps"} : q4_0[4,64,64]
%10 = moe_matmul(%3, %9, %7) {activations="q8"} : f32[T,128]
%11 = moe_sum(%10, %8) : f32[T,64]
output y = %11
"""


def test_the_moe_ops_have_rows_and_an_expert_type_without_a_kernel_is_refused():
    """A MoE layer's five ops are accepted (vulkan/moe_records.py); an expert stack of a type without
    a matvec is refused naming the type, as a plain matmul's weight is."""
    graph = run_pipeline(parse_graph(MOE_GRAPH), device_passes("vulkan"))
    assert unsupported(graph) is None
    stack = next(n for n in graph.nodes if n.op is Op.PARAM and n.attrs.tensor == "down_exps")
    assert "IQ4_XS weights" in unsupported(with_node(graph, stack.id, type=replace(stack.type, dtype="iq4_xs")))
