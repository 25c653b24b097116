"""Splitting a model's graph between its first layers and the rest, for a model larger than the GPU:
the first layers run on the CPU, the rest on the GPU, and one hidden state per token crosses.

Owns: `split_layers(graph, first_layer)`: the graph of everything before `first_layer` (the
embedding and layers 0 .. first_layer - 1), whose one output "hidden" is the value the later layers
read from it (the residual stream entering `first_layer`), and which nodes belong to it. Does not
own running either part (codegen/cuda/model.py's SplitModel) or choosing the layer.

A node's layer is the highest layer among the weights and caches it depends on (a weight's layer from
its GGUF name, `blk.N.`, a cache's from its attrs); the head is every node below `first_layer`. A
graph splits there only if exactly one computed value of the head is read by the rest, which holds
for every residual transformer: anything else (a value computed before the layers and read again
after them) is refused, so a split never silently recomputes or drops a value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kinetic.ir.graph import Graph
from kinetic.ir.ops import LEAVES, Op
from kinetic.passes.dce import eliminate_dead_code

_BLOCK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class LayerSplit:
    head: Graph  # the first layers, one output ("hidden", boundary)
    boundary: int  # node id of the value crossing to the rest (in the full graph and in head)
    first_layer: int
    head_ids: frozenset[int]  # every node of the full graph below first_layer (leaves included)


def layer_of_nodes(graph: Graph) -> dict[int, int]:
    """node id -> the highest layer it depends on (-1: none, as the embedding and its inputs)."""
    top: dict[int, int] = {}
    for node in graph.nodes:
        own = -1
        if node.op is Op.PARAM:
            m = _BLOCK.match(node.attrs.tensor)
            own = int(m.group(1)) if m else -1
        elif node.op is Op.STATE:
            own = node.attrs.layer
        top[node.id] = max([own, *(top[i] for i in node.inputs)])
    return top


def n_layers(graph: Graph) -> int:
    return len({n.attrs.layer for n in graph.nodes if n.op is Op.STATE})


def split_layers(graph: Graph, first_layer: int) -> LayerSplit:
    """The head (layers before first_layer) as its own graph, and where it meets the rest; ValueError
    when the graph cannot be split there."""
    if not 0 < first_layer < n_layers(graph):
        raise ValueError(f"a split needs a layer between 1 and {n_layers(graph) - 1}, not {first_layer}")
    top = layer_of_nodes(graph)
    head = {nid for nid, layer in top.items() if layer < first_layer}
    users = graph.users()
    crossing = [n.id for n in graph.nodes
                if n.id in head and n.op not in LEAVES and any(u not in head for u in users[n.id])]
    if len(crossing) != 1:
        raise ValueError(f"layer {first_layer} reads {len(crossing)} computed values of the layers before it, "
                         "not one hidden state: this graph cannot be split there")
    boundary = crossing[0]
    if any(nid == boundary or nid in head for _, nid in graph.outputs):
        raise ValueError("an output of the graph is computed before the split")
    head_graph = eliminate_dead_code(Graph(tuple(n for n in graph.nodes if n.id in head), (("hidden", boundary),),
                                           graph.meta))
    return LayerSplit(head_graph, boundary, first_layer, frozenset(head))
