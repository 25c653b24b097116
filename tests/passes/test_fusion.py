"""Fusion: mul(silu(a), b) -> swiglu(a, b) and mul(gelu(a), b) -> geglu(a, b), only when the
activation has no other reader."""

from __future__ import annotations

from kinetic.passes import fuse
from kinetic.passes.fusion import FUSION_RULES

GATE_UP = """
%3 = param() {tensor="gate"} : f32[12,8]
%4 = matmul(%2, %3) {activations="f32"} : f32[T,12]
%5 = param() {tensor="up"} : f32[12,8]
%6 = matmul(%2, %5) {activations="f32"} : f32[T,12]
"""


def test_swiglu_fuses(check, prelude):
    """mul(silu(gate), up) becomes swiglu(gate, up), in the mul's place; the silu is left dead."""
    before = prelude + GATE_UP + """
%7 = silu(%4) : f32[T,12]
%8 = mul(%7, %6) : f32[T,12]
output out = %8
"""
    expected = prelude + GATE_UP + """
%7 = silu(%4) : f32[T,12]
%8 = swiglu(%4, %6) : f32[T,12]
output out = %8
"""
    check(fuse, before, expected)


def test_swiglu_fuses_with_operands_swapped(check, prelude):
    """mul(up, silu(gate)) is the same product: it fuses to swiglu(gate, up)."""
    before = prelude + GATE_UP + """
%7 = silu(%4) : f32[T,12]
%8 = mul(%6, %7) : f32[T,12]
output out = %8
"""
    expected = prelude + GATE_UP + """
%7 = silu(%4) : f32[T,12]
%8 = swiglu(%4, %6) : f32[T,12]
output out = %8
"""
    check(fuse, before, expected)


def test_geglu_fuses(check, prelude):
    """mul(gelu(gate), up) becomes geglu(gate, up), bit for bit the same numbers."""
    before = prelude + GATE_UP + """
%7 = gelu(%4) : f32[T,12]
%8 = mul(%7, %6) : f32[T,12]
output out = %8
"""
    expected = prelude + GATE_UP + """
%7 = gelu(%4) : f32[T,12]
%8 = geglu(%4, %6) : f32[T,12]
output out = %8
"""
    check(fuse, before, expected)


def test_no_fusion_when_activation_has_another_user(check, prelude):
    """A silu that another node also reads stays, and the mul is not fused (no repeated work)."""
    before = prelude + GATE_UP + """
%7 = silu(%4) : f32[T,12]
%8 = mul(%7, %6) : f32[T,12]
%9 = add(%8, %7) : f32[T,12]
output out = %9
"""
    check(fuse, before, before)


def test_no_fusion_when_activation_is_an_output(check, prelude):
    """A graph output counts as a reader: its gelu keeps feeding the mul."""
    before = prelude + GATE_UP + """
%7 = gelu(%4) : f32[T,12]
%8 = mul(%7, %6) : f32[T,12]
output out = %8
output act = %7
"""
    check(fuse, before, before)


def test_product_of_two_activations_fuses_once(check, prelude):
    """mul(silu(a), silu(b)): the first silu is absorbed, the second stays an ordinary input."""
    before = prelude + GATE_UP + """
%7 = silu(%4) : f32[T,12]
%8 = silu(%6) : f32[T,12]
%9 = mul(%7, %8) : f32[T,12]
output out = %9
"""
    expected = prelude + GATE_UP + """
%7 = silu(%4) : f32[T,12]
%8 = silu(%6) : f32[T,12]
%9 = swiglu(%4, %8) : f32[T,12]
output out = %9
"""
    check(fuse, before, expected)


def test_every_fusion_rule_states_its_algebra():
    """Each rule's docstring has the `before -> after` form style.md asks for."""
    for r in FUSION_RULES:
        assert r.rewrite.__doc__ and "->" in r.rewrite.__doc__, r.name
