"""Dead-code elimination: exactly the nodes the outputs depend on survive."""

from __future__ import annotations

from kinetic.passes import eliminate_dead_code


def test_unreachable_nodes_and_params_are_dropped(check, prelude):
    """A branch and a weight no output reads disappear; the rest keeps its ids and order."""
    before = prelude + """
%3 = param() {tensor="unused"} : f32[4,8]
%4 = matmul(%2, %3) {activations="f32"} : f32[T,4]
%5 = silu(%4) : f32[T,4]
%6 = gelu(%2) : f32[T,8]
output out = %6
"""
    expected = prelude + """
%6 = gelu(%2) : f32[T,8]
output out = %6
"""
    check(eliminate_dead_code, before, expected)


def test_live_graph_is_unchanged(check, prelude):
    """Nothing is dropped when every node feeds an output (several outputs included)."""
    before = prelude + """
%3 = silu(%2) : f32[T,8]
%4 = gelu(%2) : f32[T,8]
output a = %3
output b = %4
"""
    check(eliminate_dead_code, before, before)


def test_graph_without_outputs_becomes_empty(prelude):
    """With no outputs nothing is live."""
    from kinetic.ir.text import parse_graph

    assert eliminate_dead_code(parse_graph(prelude)).nodes == ()
