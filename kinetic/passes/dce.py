"""Dead-code elimination: drop every node the graph's outputs do not depend on.

Owns: `eliminate_dead_code`. Nothing in the IR has side effects a pass could lose: runtime state
(the KV cache) is written through the attention nodes that produce outputs, so an unreachable node
computes nothing anyone reads.
"""

from __future__ import annotations

from kinetic.ir.graph import Graph


def live_ids(graph: Graph) -> set[int]:
    """Ids of the nodes the outputs read, directly or through other nodes."""
    live = {node_id for _, node_id in graph.outputs}
    for node in reversed(graph.nodes):
        if node.id in live:
            live.update(node.inputs)
    return live


def eliminate_dead_code(graph: Graph) -> Graph:
    """The graph without nodes no output depends on; order and ids of the rest unchanged."""
    live = live_ids(graph)
    return Graph(tuple(n for n in graph.nodes if n.id in live), graph.outputs, graph.meta)
