"""The reduction-order check (kinetic/codegen/common/orders.py) and each device's declaration: a graph
with a reduction in an order a device does not declare is refused naming it, every declared name is
an order, and the real models need no order a device lacks."""

from __future__ import annotations

import importlib

import pytest

from kinetic.codegen.common.orders import refused_order
from kinetic.ir.orders import ORDERS
from kinetic.ir.text import parse_graph
from kinetic.passes import PassOptions, run_pipeline

# the module holding each device's Capabilities record (its reduction orders), read by its unsupported()
DECLARATIONS = {"cpu": "kinetic.codegen.cpu.target", "cuda-emulated": "kinetic.codegen.cuda.renderer",
                "vulkan": "kinetic.codegen.vulkan.kernels"}

GGML_PASSES = PassOptions(numerics="ggml")

GRAPH = """
%0 = input() {name="tokens"} : i32[T]
%1 = param() {tensor="token_embd.weight"} : q8_0[16,128]
%2 = embed(%1, %0) : f32[T,128]
%3 = param() {tensor="wk"} : q8_0[64,128]
%4 = matmul(%2, %3) {activations="q8"} : f32[T,64]
%5 = state() {name="kv.0", layer=0, n_kv_head=1, head_dim=64} : kv[]
%6 = attention(%2, %4, %4, %5) {n_head=2, n_kv_head=1, head_dim=64, scale=0.125, kv_dtype="KV"} : f32[T,128]
%7 = input() {name="output_rows"} : i32[R]
%8 = take_rows(%6, %7) : f32[R,128]
output logits = %8
"""


def test_a_reduction_in_an_undeclared_order_is_refused_naming_it():
    """Attention over an f32 cache sums in key_chain_f32: a device declaring only the f16 chain refuses
    it, naming the node, the order and what it follows; declaring it too accepts the graph (ggml's
    orders: the Q8_0 matmul's lanes8)."""
    graph = run_pipeline(parse_graph(GRAPH.replace("KV", "f32")), GGML_PASSES)
    reason = refused_order(graph, {"lanes8", "key_chain_f16"}, "Toy")
    assert reason == ("attention %6 sums in order 'key_chain_f32', which no Toy kernel follows "
                      "(Toy follows key_chain_f16, lanes8)")
    assert refused_order(graph, {"lanes8", "key_chain_f16", "key_chain_f32"}, "Toy") is None


def test_a_graph_before_the_pipeline_is_checked_by_the_orders_its_specs_give():
    """Without the batch-invariance pass (orders not written), the check derives each order: the
    q8_0 matmul's lanes8 is missing from the declaration, so it is refused."""
    graph = parse_graph(GRAPH.replace("KV", "f16"))
    assert "matmul %4 sums in order 'lanes8'" in refused_order(graph, {"key_chain_f16"}, "Toy")


@pytest.mark.parametrize("device", sorted(DECLARATIONS))
def test_every_declared_order_is_an_order(device):
    """A device declares only names kinetic/ir/orders.py describes (a typo would refuse every graph)."""
    declared = importlib.import_module(DECLARATIONS[device]).CAPABILITIES.reduction_orders
    assert declared and set(declared) <= set(ORDERS)


@pytest.mark.parametrize("device", sorted(DECLARATIONS))
@pytest.mark.parametrize("fixture", ["smollm2_path", "gemma_path"])
def test_the_real_models_need_no_order_a_device_lacks(device, fixture, request):
    """In each numerics mode a device follows, every reduction of SmolLM2 and Gemma 3 sums in an order
    the device declares, as that mode gives it."""
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.frontend.lower import lower

    lowered = lower(open_gguf(request.getfixturevalue(fixture)))
    caps = importlib.import_module(DECLARATIONS[device]).CAPABILITIES
    for mode in sorted(caps.numerics):
        graph = run_pipeline(lowered, PassOptions(numerics=mode))
        assert refused_order(graph, caps.reduction_orders, device, caps.numerics) is None, mode


@pytest.mark.parametrize("device", sorted(DECLARATIONS))
def test_each_device_refuses_an_order_it_stops_declaring(device, monkeypatch):
    """The declaration is what the device checks: without key_chain_f16 in it, the device's
    unsupported(graph) names that order (the CPU's compiled step then leaves the graph to its
    op-by-op executor)."""
    from dataclasses import replace

    from kinetic import devices
    from kinetic.codegen.cpu import lowering

    module = importlib.import_module(DECLARATIONS[device])
    graph = run_pipeline(parse_graph(GRAPH.replace("KV", "f16")), GGML_PASSES)  # every device's mode
    caps = module.CAPABILITIES
    fewer = replace(caps, reduction_orders=caps.reduction_orders - {"key_chain_f16"})
    monkeypatch.setattr(module, "CAPABILITIES", fewer)
    unsupported = lowering.unsupported if device == "cpu" else devices.DEVICES[device].unsupported
    assert "'key_chain_f16'" in unsupported(graph)
    monkeypatch.undo()
    assert unsupported(graph) is None


def test_the_order_attribute_changes_nothing_on_the_cpu_tape():
    """The compiled step lowers SmolLM2's graph in ggml's orders (those a graph without orders means)
    to the same instructions (op codes, floats, buffers read and written) with its orders written as
    with them left empty: the attribute is a contract the kernels already keep, not an instruction."""
    from dataclasses import replace

    from kinetic.codegen.cpu.step import CompiledStep
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.frontend.lower import lower
    from kinetic.ir.graph import Graph
    from kinetic.runtime.weights import GGUFWeights
    from tests.conftest import model_path

    gguf = open_gguf(model_path("smollm2-135m"))
    ordered = run_pipeline(lower(gguf), GGML_PASSES)
    empty = Graph(tuple(replace(n, attrs=replace(n.attrs, order="")) if hasattr(n.attrs, "order") else n
                        for n in ordered.nodes), ordered.outputs, ordered.meta)
    assert empty != ordered
    plans = [CompiledStep(g, GGUFWeights(gguf), threads=1, rows=4).plan.instrs for g in (ordered, empty)]
    assert [(i.op, i.floats, i.reads, i.writes) for i in plans[0]] == \
           [(i.op, i.floats, i.reads, i.writes) for i in plans[1]]
