"""Batch invariance: every reduction names, in the IR, the per-row order it sums in.

Owns: `assign_reduction_orders`, the pipeline's last phase. Its one rule, for every node whose op is
in the REDUCE group (matmul, rms_norm, attention, and any reducing op added later):

    op(inputs) {..., order=""}  ->  op(inputs) {..., order=O}   where O = OPS[op].order(input types, attrs)

O is the order the op's reference follows on those inputs (kinetic/ir/orders.py: a matmul's comes
from its weight type and activations, a norm's is "f64_sum", attention's "key_chain_f16" or
"key_chain_f32" by its cache type). Every order there is a per-row order, fixed by widths and never by
the number of rows in the pass, so the attribute states in `--dump-ir` what makes a row's floats the
same alone as in any batch; each device honours it with a kernel that follows it, or refuses the graph
naming it (its Capabilities' `reduction_orders`, checked by kinetic/codegen/common/orders.py).

Exact: the attribute names what the reference already computes and changes no value (the verifier
refuses an order that is not the reference's). Idempotent: an assigned order is assigned again to the
same name. A reducing op whose spec names no order is an error here, so a new reduction cannot slip
through without one.
"""

from __future__ import annotations

from dataclasses import replace

from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import OPS, REDUCE, VerifyError


def _with_order(node: Node, graph: Graph) -> Node:
    spec = OPS[node.op]
    if spec.order is None:
        raise VerifyError(f"{node.op.value} reduces but its spec names no order (kinetic/ir/orders.py)")
    order = spec.order([graph.node(i).type for i in node.inputs], node.attrs)
    return node if node.attrs.order == order else replace(node, attrs=replace(node.attrs, order=order))


def assign_reduction_orders(graph: Graph) -> Graph:
    """The graph with every reduction's `order` attribute set to its reference's order; ids, inputs,
    types and every other node unchanged."""
    nodes = tuple(_with_order(n, graph) if n.op in REDUCE else n for n in graph.nodes)
    return Graph(nodes, graph.outputs, graph.meta)
