"""The reduction-order check every device's `unsupported(graph)` makes: honour the order or refuse.

Owns: `refused_order(graph, implemented, device)`. A device declares the reduction orders its
kernels follow in its Capabilities record (`reduction_orders`, names from kinetic/ir/orders.py); a
graph with a reduction in any other order is refused, naming the node, its order and what the
device follows. Does not own the orders (kinetic/ir/orders.py), which order a node has (its `order`
attribute, written by kinetic/passes/batch_invariance.py; for a graph that has not been through the
pipeline, the one its spec gives: ops.reduction_order) nor any device's declaration.
"""

from __future__ import annotations

from collections.abc import Set

from kinetic.ir.graph import Graph
from kinetic.ir.ops import REDUCE, reduction_order


def refused_order(graph: Graph, implemented: Set[str], device: str) -> str | None:
    """Why `device`, whose kernels follow only the `implemented` orders, cannot run `graph`: the first
    reduction whose order is not among them; None when every reduction's is."""
    for node in graph.nodes:
        if node.op not in REDUCE:
            continue
        order = reduction_order(node.op, [graph.node(i).type for i in node.inputs], node.attrs)
        if order not in implemented:
            return (f"{node.op.value} %{node.id} sums in order {order!r}, which no {device} kernel follows "
                    f"({device} follows {', '.join(sorted(implemented))})")
    return None
