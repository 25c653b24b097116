"""Fusion: an activation feeding a multiplication becomes one gated op.

Owns: the FUSION rules and `fuse`. A fusion fires only when the intermediate value has no other
reader (another node or a graph output), so no work is repeated and nothing else loses its input.
The fused ops are defined by the reference interpreter as exactly the two ops they replace, so every
rule here is exact; the gain is one pass over memory instead of two and no intermediate tensor.
"""

from __future__ import annotations

from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import Op
from kinetic.passes.rewrite import Match, apply_rules, pat, rule


def _gated(m: Match, fused: Op) -> Node | None:
    if m.uses(m["act"]) != 1:
        return None
    return m.make(fused, (m["gate"], m["up"]))


@rule(pat(Op.MUL, pat(Op.SILU, pat(name="gate"), name="act"), pat(name="up"), commutative=True))
def fuse_swiglu(m: Match) -> Node | None:
    """mul(silu(gate), up) -> swiglu(gate, up)   (also mul(up, silu(gate)): multiplication commutes)"""
    return _gated(m, Op.SWIGLU)


@rule(pat(Op.MUL, pat(Op.GELU, pat(name="gate"), name="act"), pat(name="up"), commutative=True))
def fuse_geglu(m: Match) -> Node | None:
    """mul(gelu(gate), up) -> geglu(gate, up)   (also mul(up, gelu(gate)): multiplication commutes)"""
    return _gated(m, Op.GEGLU)


FUSION_RULES = (fuse_swiglu, fuse_geglu)


def fuse(graph: Graph) -> Graph:
    """Apply FUSION_RULES until none fires; the unfused activations are left for dead-code elimination."""
    return apply_rules(graph, FUSION_RULES)
