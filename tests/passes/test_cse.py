"""Common-subexpression elimination: one node per distinct computation, exact."""

from __future__ import annotations

from kinetic.passes import eliminate_common_subexpressions


def test_repeated_matmul_and_param_merge(check, prelude):
    """The same weight named twice and the same product computed twice become one of each."""
    before = prelude + """
%3 = param() {tensor="w"} : f32[4,8]
%4 = param() {tensor="w"} : f32[4,8]
%5 = matmul(%2, %3) {activations="f32"} : f32[T,4]
%6 = matmul(%2, %4) {activations="f32"} : f32[T,4]
%7 = add(%5, %6) : f32[T,4]
output out = %7
"""
    expected = prelude + """
%3 = param() {tensor="w"} : f32[4,8]
%5 = matmul(%2, %3) {activations="f32"} : f32[T,4]
%7 = add(%5, %5) : f32[T,4]
output out = %7
"""
    check(eliminate_common_subexpressions, before, expected)


def test_commutative_operands_in_either_order_merge(check, prelude):
    """add(a, b) and add(b, a) are one value (IEEE addition commutes)."""
    before = prelude + """
%3 = silu(%2) : f32[T,8]
%4 = add(%2, %3) : f32[T,8]
%5 = add(%3, %2) : f32[T,8]
%6 = mul(%4, %5) : f32[T,8]
output out = %6
"""
    expected = prelude + """
%3 = silu(%2) : f32[T,8]
%4 = add(%2, %3) : f32[T,8]
%6 = mul(%4, %4) : f32[T,8]
output out = %6
"""
    check(eliminate_common_subexpressions, before, expected)


def test_different_attributes_do_not_merge(check, prelude):
    """scale by 2 and scale by 3 are different computations; matmul q8 and f32 too."""
    before = prelude + """
%3 = scale(%2) {factor=2.0} : f32[T,8]
%4 = scale(%2) {factor=3.0} : f32[T,8]
%5 = add(%3, %4) : f32[T,8]
output out = %5
"""
    check(eliminate_common_subexpressions, before, before)


def test_outputs_follow_merged_nodes(check, prelude):
    """An output naming a duplicate names the surviving node."""
    before = prelude + """
%3 = gelu(%2) : f32[T,8]
%4 = gelu(%2) : f32[T,8]
output a = %3
output b = %4
"""
    expected = prelude + """
%3 = gelu(%2) : f32[T,8]
output a = %3
output b = %3
"""
    check(eliminate_common_subexpressions, before, expected)
