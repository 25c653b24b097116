"""The reduction-order check every device's `unsupported(graph)` makes: honour the order or refuse.

Owns: `refused_order(graph, implemented, device, numerics)`. A device declares the reduction orders
its kernels follow in its Capabilities record (`reduction_orders`, names from kinetic/ir/orders.py)
and the numerics modes whose orders they follow (`numerics`: an order name such as "block_chain"
covers only the weight types that take it in those modes); a graph with a reduction in any other
order is refused, naming the node, its order and what the device follows. Does not own the orders
(kinetic/ir/orders.py), which order a node has (its `order` attribute, written by
kinetic/passes/batch_invariance.py; for a graph that has not been through the pipeline, the one its
spec gives: ops.reduction_order) nor any device's declaration.
"""

from __future__ import annotations

from collections.abc import Set

from kinetic.ir.graph import Graph
from kinetic.ir.ops import REDUCE, mode_order, reduction_order


def refused_order(graph: Graph, implemented: Set[str], device: str,
                  numerics: Set[str] = frozenset({"ggml"})) -> str | None:
    """Why `device`, whose kernels follow only the `implemented` orders, and those only as the
    `numerics` modes give them (its Capabilities' `numerics`), cannot run `graph`: the first reduction
    whose order is not among them, or is not the order its inputs take in one of those modes (a
    Q8_0 matmul in "block_chain" on a device whose block_chain kernels are ggml's Q4_0 ones); None
    when every reduction's order is one it follows."""
    for node in graph.nodes:
        if node.op not in REDUCE:
            continue
        types = [graph.node(i).type for i in node.inputs]
        order = reduction_order(node.op, types, node.attrs)
        if order not in implemented:
            return (f"{node.op.value} %{node.id} sums in order {order!r}, which no {device} kernel follows "
                    f"({device} follows {', '.join(sorted(implemented))})")
        if order not in {mode_order(node.op, types, node.attrs, mode) for mode in numerics}:
            return (f"{node.op.value} %{node.id} sums in order {order!r} (another numerics mode's), which "
                    f"{device}'s kernels do not follow for its inputs ({device} follows the numerics modes "
                    f"{', '.join(sorted(numerics))}; run with --numerics ggml)")
    return None
