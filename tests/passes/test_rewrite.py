"""The rule engine: patterns, commutative matching, rule composition and its safety checks."""

from __future__ import annotations

import pytest

from kinetic.ir.graph import Node
from kinetic.ir.ops import NoAttrs, Op, ScaleAttrs
from kinetic.ir.text import parse_graph, print_graph
from kinetic.passes.rewrite import Match, apply_rules, match, pat, rule

SNIPPET = """
%0 = input() {name="tokens"} : i32[T]
%1 = param() {tensor="t"} : f32[16,8]
%2 = embed(%1, %0) : f32[T,8]
%3 = silu(%2) : f32[T,8]
%4 = mul(%2, %3) : f32[T,8]
%5 = mul(%3, %3) : f32[T,8]
output a = %4
output b = %5
"""


def _nodes(graph):
    return {n.id: n for n in graph.nodes}


def test_commutative_pattern_tries_both_orders():
    """mul(x, silu(y)) matches a commutative mul(silu(y), x) pattern, and not a non-commutative one."""
    graph = parse_graph(SNIPPET)
    nodes = _nodes(graph)
    both = pat(Op.MUL, pat(Op.SILU, name="act"), pat(name="x"), commutative=True)
    ordered = pat(Op.MUL, pat(Op.SILU, name="act"), pat(name="x"))
    bound: dict = {}
    assert match(both, nodes[4], nodes, bound) and bound["x"].id == 2 and bound["act"].id == 3
    assert not match(ordered, nodes[4], nodes, {})


def test_a_name_bound_twice_must_be_the_same_node():
    """mul(x, x) matches %5 = mul(%3, %3) but not %4 = mul(%2, %3)."""
    graph = parse_graph(SNIPPET)
    nodes = _nodes(graph)
    square = pat(Op.MUL, pat(name="x"), pat(name="x"))
    assert match(square, nodes[5], nodes, {})
    assert not match(square, nodes[4], nodes, {})


@rule(pat(Op.SILU, pat(name="x")))
def silu_to_gelu(m: Match):
    """silu(x) -> gelu(x)   (a test rule, not an identity)"""
    return m.make(Op.GELU, (m["x"],))


@rule(pat(Op.GELU, pat(name="x")))
def gelu_to_scale(m: Match):
    """gelu(x) -> scale(x, 2.0)   (a test rule, not an identity)"""
    return m.make(Op.SCALE, (m["x"],), ScaleAttrs(factor=2.0))


def test_rule_lists_compose_with_plus():
    """(a,) + (b,) applies both: silu becomes gelu, which the second rule turns into a scale."""
    graph = parse_graph(SNIPPET)
    out = apply_rules(graph, (silu_to_gelu,) + (gelu_to_scale,))
    assert "%3 = scale(%2) {factor=2.0} : f32[T,8]" in print_graph(out)
    assert "%3 = gelu" in print_graph(apply_rules(graph, (silu_to_gelu,)))


def test_rule_returning_a_foreign_node_is_refused():
    """A rule may return a new node or one already in the graph, nothing else."""

    @rule(pat(Op.SILU, pat(name="x")))
    def bogus(m: Match):
        """silu(x) -> (a node from nowhere)"""
        return Node(999, Op.GELU, NoAttrs(), (m["x"].id,), m.root.type)

    with pytest.raises(RuntimeError, match="neither new nor in the graph"):
        apply_rules(parse_graph(SNIPPET), (bogus,))


def test_rules_that_never_settle_are_stopped():
    """A rule that always fires (doubling a scale forever) raises instead of looping."""

    @rule(pat(Op.SCALE, pat(name="x"), name="s"))
    def grow(m: Match):
        """scale(x, a) -> scale(x, 2a)   (never settles)"""
        return m.make(Op.SCALE, (m["x"],), ScaleAttrs(factor=m["s"].attrs.factor * 2))

    graph = parse_graph(SNIPPET.replace("%5 = mul(%3, %3)", "%5 = scale(%3) {factor=1.0}"))
    with pytest.raises(RuntimeError, match="keep rewriting"):
        apply_rules(graph, (grow,))


@rule(pat(Op.MUL, pat(name="a"), pat(name="b"), name="root"))
def silu_before_mul(m: Match):
    """mul(a, b) -> mul(s, b) with s = silu(a) inserted before it, once (a test rule)"""
    if m["a"].op is Op.SILU:
        return None
    earlier = [r for r in m.earlier_readers(m["a"]) if r.op is Op.SILU]
    s = earlier[0] if earlier else m.insert(Op.SILU, (m["a"],))
    return m.make(Op.MUL, (s, m["b"]))


def test_a_rule_inserts_a_node_before_the_root_and_sees_earlier_readers():
    """`insert` places a new node with a fresh id just before the root; a later root finds it among
    the earlier readers of its input and reads it instead of inserting another."""
    snippet = """
%0 = input() {name="tokens"} : i32[T]
%1 = param() {tensor="t"} : f32[16,8]
%2 = embed(%1, %0) : f32[T,8]
%3 = mul(%2, %2) : f32[T,8]
%4 = mul(%2, %3) : f32[T,8]
output a = %4
"""
    out = print_graph(apply_rules(parse_graph(snippet), (silu_before_mul,)))
    assert "%5 = silu(%2) : f32[T,8]\n%3 = mul(%5, %2)" in out
    assert "%4 = mul(%5, %3)" in out and out.count("silu(") == 1


def test_kept_nodes_are_never_rewritten():
    """A node in `keep` is not a root: the rule that rewrites it otherwise leaves it as it is."""
    graph = parse_graph(SNIPPET)
    assert "%3 = gelu" in print_graph(apply_rules(graph, (silu_to_gelu,)))
    assert "%3 = silu" in print_graph(apply_rules(graph, (silu_to_gelu,), keep=frozenset({3})))
