"""Canonicalization: algebraic simplifications that are exact, then dense renumbering.

Owns: the SIMPLIFY rules, `simplify` (applies them), `renumber` (ids 0..n-1 in topological order)
and `canonicalize` (simplify, drop dead code, renumber). Every rule here gives bit for bit the same
result as the graph it replaces, on every input.
"""

from __future__ import annotations

import math

from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import Op, ScaleAttrs
from kinetic.passes.dce import eliminate_dead_code
from kinetic.passes.rewrite import Match, apply_rules, pat, rule


@rule(pat(Op.SCALE, pat(name="x"), name="s"))
def fold_unit_scale(m: Match) -> Node | None:
    """scale(x, 1.0) -> x   (x * 1 == x for every float, signed zeros and NaN included)"""
    return m["x"] if m["s"].attrs.factor == 1.0 else None


def _is_power_of_two(value: float) -> bool:
    return math.isfinite(value) and value != 0.0 and abs(math.frexp(value)[0]) == 0.5


@rule(pat(Op.SCALE, pat(Op.SCALE, pat(name="x"), name="inner"), name="outer"))
def merge_scales(m: Match) -> Node | None:
    """scale(scale(x, a), b) -> scale(x, a * b)   when a or b is a power of two (positive or negative).

    Multiplying by 2^k only moves the exponent, so (x * a) * 2^k == x * (a * 2^k) and the merged
    factor rounds to float32 exactly as the two did; this holds while values stay in float32's
    normal range. Other pairs would round twice in one order and once in the other, so they stay.
    """
    a, b = m["inner"].attrs.factor, m["outer"].attrs.factor
    if not (_is_power_of_two(a) or _is_power_of_two(b)):
        return None
    return m.make(Op.SCALE, (m["x"],), ScaleAttrs(factor=a * b))


SIMPLIFY_RULES = (fold_unit_scale, merge_scales)


def simplify(graph: Graph) -> Graph:
    """Apply SIMPLIFY_RULES until none fires."""
    return apply_rules(graph, SIMPLIFY_RULES)


def renumber(graph: Graph) -> Graph:
    """Ids 0, 1, 2 ... in the nodes' (topological) order; outputs follow their nodes."""
    new_id = {n.id: i for i, n in enumerate(graph.nodes)}
    nodes = tuple(
        Node(new_id[n.id], n.op, n.attrs, tuple(new_id[i] for i in n.inputs), n.type) for n in graph.nodes
    )
    outputs = tuple((name, new_id[i]) for name, i in graph.outputs)
    return Graph(nodes, outputs, graph.meta)


def canonicalize(graph: Graph) -> Graph:
    """The canonical form: simplified, without dead nodes, ids dense in topological order."""
    return renumber(eliminate_dead_code(simplify(graph)))
