"""The graph and its verifier: structural equality, users, the builder, and every verifier check."""

from __future__ import annotations

import dataclasses

import pytest

from kinetic.ir.graph import Graph, GraphBuilder, Node, verify
from kinetic.ir.ops import InputAttrs, NoAttrs, Op, ParamAttrs, ScaleAttrs, VerifyError
from kinetic.ir.types import f32, i32


def _small() -> Graph:
    b = GraphBuilder()
    tokens = b.add(Op.INPUT, attrs=InputAttrs("tokens"))
    table = b.param("token_embd.weight", f32(16, 8))
    x = b.add(Op.EMBED, (table, tokens))
    y = b.add(Op.SILU, (x,))
    b.output("out", b.add(Op.MUL, (x, y)))
    b.meta.append(("family", "toy"))
    return b.build()


def _with_node(graph: Graph, index: int, node: Node) -> Graph:
    nodes = list(graph.nodes)
    nodes[index] = node
    return Graph(tuple(nodes), graph.outputs, graph.meta)


def test_equality_is_structural():
    """Two graphs built the same way are equal; changing one attribute makes them differ."""
    a, b = _small(), _small()
    assert a == b and a is not b
    changed = _with_node(b, 3, dataclasses.replace(b.nodes[3], op=Op.GELU))
    assert changed != a


def test_users_and_lookup():
    """users() lists the readers of each node; output() finds a node by name; unknown names raise."""
    g = _small()
    assert g.users() == {0: [2], 1: [2], 2: [3, 4], 3: [4], 4: []}
    assert g.output("out").op is Op.MUL
    with pytest.raises(KeyError):
        g.output("missing")
    assert g.get_meta("family") == "toy"


def test_builder_shares_a_tensor_asked_for_twice():
    """param() for the same GGUF tensor returns one node (tied weights)."""
    b = GraphBuilder()
    assert b.param("w", f32(4, 8)) == b.param("w", f32(4, 8))
    assert len(b.nodes) == 1


def test_verify_accepts_a_good_graph():
    """The builder's graph verifies (build() already ran verify; running it again agrees)."""
    verify(_small())


@pytest.mark.parametrize(
    ("break_graph", "message"),
    [
        (lambda g: _with_node(g, 4, dataclasses.replace(g.nodes[4], id=3)), "defined twice"),
        (lambda g: _with_node(g, 3, dataclasses.replace(g.nodes[3], inputs=(4,))), "before it is defined"),
        (lambda g: _with_node(g, 3, dataclasses.replace(g.nodes[3], attrs=ScaleAttrs(2.0))), "attributes"),
        (lambda g: _with_node(g, 3, dataclasses.replace(g.nodes[3], type=f32("T", 9))), "spec says"),
        (lambda g: _with_node(g, 1, Node(1, Op.PARAM, ParamAttrs("t"), (0,), f32(16, 8))), "no inputs"),
        (lambda g: Graph(g.nodes, (("out", 42),), g.meta), "undefined node %42"),
        (lambda g: _with_node(g, 3, Node(3, Op.SILU, NoAttrs(), (0,), f32("T", 8))), "must be f32"),
        (lambda g: _with_node(g, 0, Node(0, Op.INPUT, InputAttrs("colour"), (), i32("T"))), "unknown input"),
    ],
)
def test_verify_rejects(break_graph, message):
    """Each broken invariant is a VerifyError that says which."""
    with pytest.raises(VerifyError, match=message):
        verify(break_graph(_small()))
