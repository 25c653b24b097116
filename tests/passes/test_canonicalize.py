"""Canonicalization: exact scale folds, dead nodes dropped, ids dense in topological order."""

from __future__ import annotations

import numpy as np

from kinetic.ir.text import parse_graph
from kinetic.passes import canonicalize, renumber, simplify
from kinetic.passes.canonicalize import SIMPLIFY_RULES


def test_unit_scale_folds_away(check, prelude):
    """scale(x, 1.0) -> x: readers of the scale read x, and ids close up."""
    before = prelude + """
%3 = scale(%2) {factor=1.0} : f32[T,8]
%4 = silu(%3) : f32[T,8]
output out = %4
"""
    expected = prelude + """
%3 = silu(%2) : f32[T,8]
output out = %3
"""
    check(canonicalize, before, expected)


def test_unit_scale_that_is_an_output_folds(check, prelude):
    """An output naming a folded scale names its input instead."""
    before = prelude + """
%3 = scale(%2) {factor=1.0} : f32[T,8]
output out = %3
"""
    check(canonicalize, before, prelude + "output out = %2\n")


def test_scale_by_power_of_two_merges(check, prelude):
    """scale(scale(x, 3.0), 0.5) -> scale(x, 1.5); a chain of three merges into one."""
    before = prelude + """
%3 = scale(%2) {factor=3.0} : f32[T,8]
%4 = scale(%3) {factor=0.5} : f32[T,8]
%5 = scale(%4) {factor=-4.0} : f32[T,8]
output out = %5
"""
    expected = prelude + """
%3 = scale(%2) {factor=-6.0} : f32[T,8]
output out = %3
"""
    check(canonicalize, before, expected)


def test_inexact_scale_pair_stays(check, prelude):
    """Neither 0.1 nor 3.0 is a power of two, so the two scales stay two."""
    before = prelude + """
%3 = scale(%2) {factor=0.1} : f32[T,8]
%4 = scale(%3) {factor=3.0} : f32[T,8]
output out = %4
"""
    check(canonicalize, before, before)


def test_merging_inexact_scales_would_change_results():
    """Why the rule is restricted: x*0.1*3 differs from x*0.3 in float32 for some x."""
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    twice = (x * np.float32(0.1)) * np.float32(3.0)
    once = x * np.float32(0.1 * 3.0)
    assert not np.array_equal(twice, once)


def test_shared_inner_scale_merges_but_stays_for_its_other_reader(check, prelude):
    """The merged scale reads x directly; the inner scale survives for its other reader."""
    before = prelude + """
%3 = scale(%2) {factor=2.0} : f32[T,8]
%4 = scale(%3) {factor=0.75} : f32[T,8]
%5 = add(%3, %4) : f32[T,8]
output out = %5
"""
    expected = prelude + """
%3 = scale(%2) {factor=2.0} : f32[T,8]
%4 = scale(%2) {factor=1.5} : f32[T,8]
%5 = add(%3, %4) : f32[T,8]
output out = %5
"""
    check(canonicalize, before, expected)


def test_renumber_makes_ids_dense_in_order():
    """Ids with gaps become 0..n-1 in node order; inputs and outputs follow."""
    graph = parse_graph("""
%7 = input() {name="tokens"} : i32[T]
%3 = param() {tensor="t"} : f32[16,8]
%40 = embed(%3, %7) : f32[T,8]
output out = %40
""")
    assert [n.id for n in renumber(graph).nodes] == [0, 1, 2]
    assert renumber(graph).nodes[2].inputs == (1, 0)
    assert renumber(graph).outputs == (("out", 2),)


def test_simplify_keeps_ids(prelude):
    """simplify alone changes only what a rule rewrote; ids stay until renumber."""
    graph = parse_graph(prelude + """
%3 = scale(%2) {factor=1.0} : f32[T,8]
%9 = silu(%3) : f32[T,8]
output out = %9
""")
    assert [n.id for n in simplify(graph).nodes] == [0, 1, 2, 9]


def test_every_rule_states_its_algebra():
    """Each rule's docstring has the `before -> after` form style.md asks for."""
    for r in SIMPLIFY_RULES:
        assert r.rewrite.__doc__ and "->" in r.rewrite.__doc__, r.name
