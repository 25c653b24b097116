"""Batch invariance: every reduction names, in the IR, the per-row order it sums in.

Owns: `assign_reduction_orders`, the pipeline's last phase. Its one rule, for every node whose op is
in the REDUCE group (matmul, rms_norm, attention, and any reducing op added later):

    op(inputs) {..., order=""}  ->  op(inputs) {..., order=O}
    where O = mode_order(op, input types, attrs, mode)

O is the order the op's reference follows on those inputs in the numerics mode the pipeline's
options name (kinetic/ir/orders.py; "ggml": a matmul's comes from its weight type and activations, a
norm's is "f64_sum", attention's "key_chain_f16" or "key_chain_f32" by its cache type; "fast": the
ops of orders.FAST_ORDERS take their faster order, e.g. "block_chain" for a Q8_0 matmul). Every
order there is a per-row order, fixed by widths and never by the number of rows in the pass, so the
attribute states in `--dump-ir` what makes a row's floats the same alone as in any batch; each
device honours it with a kernel that follows it, or refuses the graph naming it (its Capabilities'
`reduction_orders` and `numerics`, checked by kinetic/codegen/common/orders.py).

Exact: in "ggml" mode the attribute names what the reference computes without it and changes no
value; in "fast" mode it chooses the reference's order, so the reference and every device compute
that order (the verifier refuses an order the op has in no mode). Idempotent: an assigned order is
assigned again to the same name (a graph assigned in one mode and passed again in the other gets the
other mode's orders). A reducing op whose spec names no order is an error here, so a new reduction
cannot slip through without one.
"""

from __future__ import annotations

from dataclasses import replace

from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import REDUCE, mode_order
from kinetic.ir.orders import DEFAULT_NUMERICS


def _with_order(node: Node, graph: Graph, numerics: str) -> Node:
    order = mode_order(node.op, [graph.node(i).type for i in node.inputs], node.attrs, numerics)
    return node if node.attrs.order == order else replace(node, attrs=replace(node.attrs, order=order))


def assign_reduction_orders(graph: Graph, numerics: str = DEFAULT_NUMERICS) -> Graph:
    """The graph with every reduction's `order` attribute set to its order in numerics mode `numerics`
    ("ggml" or "fast", kinetic/ir/orders.py); ids, inputs, types and every other node unchanged."""
    nodes = tuple(_with_order(n, graph, numerics) if n.op in REDUCE else n for n in graph.nodes)
    return Graph(nodes, graph.outputs, graph.meta)
