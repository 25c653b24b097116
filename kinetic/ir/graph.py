"""The graph: one node type, nodes in topological order, named outputs, and a builder.

A Node is immutable: an id, an op, its typed attributes, the ids of its inputs and its output type.
A Graph is a tuple of nodes (each input defined before use) plus named outputs. Passes build new
graphs; nothing mutates one in place. Equality is structural, so a graph parsed back from its text
form equals the original.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kinetic.ir.ops import Op, ParamAttrs, VerifyError, infer_type, spec_of
from kinetic.ir.types import TensorType


@dataclass(frozen=True)
class Node:
    id: int
    op: Op
    attrs: object
    inputs: tuple[int, ...]
    type: TensorType


@dataclass(frozen=True)
class Graph:
    nodes: tuple[Node, ...]
    outputs: tuple[tuple[str, int], ...]  # (name, node id), e.g. ("logits", 812)
    meta: tuple[tuple[str, str], ...] = ()  # free-form facts, e.g. ("family", "llama")

    _by_id: dict[int, Node] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {n.id: n for n in self.nodes})

    def node(self, node_id: int) -> Node:
        return self._by_id[node_id]

    def output(self, name: str) -> Node:
        for out_name, node_id in self.outputs:
            if out_name == name:
                return self.node(node_id)
        raise KeyError(name)

    def params(self) -> list[Node]:
        return [n for n in self.nodes if n.op is Op.PARAM]

    def users(self) -> dict[int, list[int]]:
        """node id -> ids of the nodes that read it."""
        out: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                out[i].append(n.id)
        return out

    def get_meta(self, key: str, default: str | None = None) -> str | None:
        return dict(self.meta).get(key, default)


def verify(graph: Graph) -> None:
    """Check ids are unique, inputs defined before use, attributes typed and every type re-inferred
    (leaves that carry their type, weights and caches, only checked to have no inputs)."""
    seen: dict[int, Node] = {}
    for n in graph.nodes:
        if n.id in seen:
            raise VerifyError(f"node %{n.id} is defined twice")
        spec = spec_of(n.op)
        if not isinstance(n.attrs, spec.attrs):
            raise VerifyError(f"%{n.id} = {n.op.value} has attributes {type(n.attrs).__name__}")
        for i in n.inputs:
            if i not in seen:
                raise VerifyError(f"%{n.id} = {n.op.value} reads %{i} before it is defined")
        if spec.infer is None:
            if n.inputs:
                raise VerifyError(f"%{n.id} = {n.op.value} must have no inputs")
        else:
            expected = infer_type(n.op, [seen[i].type for i in n.inputs], n.attrs)
            if expected != n.type:
                raise VerifyError(f"%{n.id} = {n.op.value} has type {n.type}, its spec says {expected}")
        seen[n.id] = n
    for name, node_id in graph.outputs:
        if node_id not in seen:
            raise VerifyError(f"output {name} names undefined node %{node_id}")


@dataclass
class GraphBuilder:
    """Appends nodes with inferred types; families use it through kinetic.frontend.blocks."""

    nodes: list[Node] = field(default_factory=list)
    outputs: list[tuple[str, int]] = field(default_factory=list)
    meta: list[tuple[str, str]] = field(default_factory=list)
    _params: dict[str, int] = field(default_factory=dict)

    def add(self, op: Op, inputs: tuple[int, ...] = (), attrs: object = None, type: TensorType | None = None) -> int:
        attrs = spec_of(op).attrs() if attrs is None else attrs
        if type is None:
            type = infer_type(op, [self.nodes[i].type for i in inputs], attrs)
        node = Node(len(self.nodes), op, attrs, tuple(inputs), type)
        self.nodes.append(node)
        return node.id

    def type_of(self, node_id: int) -> TensorType:
        return self.nodes[node_id].type

    def param(self, tensor: str, type: TensorType) -> int:
        """A weight; asking twice for the same tensor returns the same node (tied weights)."""
        if tensor not in self._params:
            self._params[tensor] = self.add(Op.PARAM, (), ParamAttrs(tensor), type)
        return self._params[tensor]

    def output(self, name: str, node_id: int) -> None:
        self.outputs.append((name, node_id))

    def build(self) -> Graph:
        graph = Graph(tuple(self.nodes), tuple(self.outputs), tuple(self.meta))
        verify(graph)
        return graph
