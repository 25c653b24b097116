"""Lowering a GGUF file to a Graph through its family descriptor.

Owns: picking the family by `general.architecture`, building the graph with shared blocks, and the
strictness checks (every tensor placed, none missing). Returns a verified Graph.
"""

from __future__ import annotations

from kinetic.frontend.blocks import Blocks, Options
from kinetic.frontend.families import family_for
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.frontend.rope_scaling import overriding
from kinetic.ir.graph import Graph


def lower(gguf: GGUFFile, options: Options | None = None) -> Graph:
    family = family_for(gguf.architecture)
    blocks = Blocks(gguf, family.name, options or Options())
    with overriding(blocks.options.rope):  # every hp.rope call of the family sees the rotary overrides
        logits = family.build(blocks)
    blocks.check_all_used()
    blocks.b.output("logits", logits)
    blocks.b.meta.extend([("family", family.name), ("architecture", gguf.architecture)])
    return blocks.b.build()
