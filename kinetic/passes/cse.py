"""Common-subexpression elimination: one node for each distinct computation.

Owns: `eliminate_common_subexpressions`. Two nodes are the same computation when they have the same
op, attributes, inputs and type; for `add` and `mul` the order of the two inputs does not matter
(IEEE addition and multiplication are commutative bit for bit). The first such node stays and the
later ones read it instead. Every op is a pure function of its inputs, so this is exact.
"""

from __future__ import annotations

from dataclasses import replace

from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import Op

COMMUTATIVE = {Op.ADD, Op.MUL}


def _key(node: Node) -> tuple:
    inputs = tuple(sorted(node.inputs)) if node.op in COMMUTATIVE else node.inputs
    return (node.op, node.attrs, inputs, node.type)


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    """Each repeated computation replaced by its first occurrence; duplicates are dropped."""
    first: dict[tuple, int] = {}
    alias: dict[int, int] = {}
    nodes = []
    for node in graph.nodes:
        node = replace(node, inputs=tuple(alias.get(i, i) for i in node.inputs))
        key = _key(node)
        if key in first:
            alias[node.id] = first[key]
            continue
        first[key] = node.id
        nodes.append(node)
    outputs = tuple((name, alias.get(i, i)) for name, i in graph.outputs)
    return Graph(tuple(nodes), outputs, graph.meta)
