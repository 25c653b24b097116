"""Which quantized matmul kernels a compiled step calls: the choices that change speed, never a bit.

Owns: `MatmulChoice` (the activation rows a kernel's tile holds, and the weight types whose full
tiles stay off the wide 512-bit paths, matmul_wide_ir and matmul_ir.LANE_TILES), `TILES` (the tiles
`kinetic compile --tune` tries) and `wide_types` (the weight types of a graph that have a wide path
at a tile, the only ones for which "narrow" changes the kernel). Does not own the kernels
(matmul_ir.render_matmul takes `tile` and `wide`) nor the search (kinetic/ktc/tune.py).

Why every choice gives the same bits: matmul_ir's kernels repeat each row's float operations in one
order whatever the tile, the thread split or the wide path (its docstring: "A row's float
operations are the same sequence whatever T, M, [n0, n1) or the variant"); tests/codegen/cpu test
the kernels so, and the tuner checks each candidate's logits against the default's before it may
be chosen (kinetic/ktc/tune_kernels.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from kinetic.codegen.cpu import matmul_wide_ir as wide_ir
from kinetic.codegen.cpu.matmul import DEFAULT_TILE
from kinetic.codegen.cpu.matmul_ir import LANE_TILES
from kinetic.codegen.cpu.quant_blocks import LAYOUTS

TILES = (4, 8, 16)  # the tiles the tuner tries: 4 and 8 have wide paths (matmul_wide_ir.ROWS), 16 has none


@dataclass(frozen=True)
class MatmulChoice:
    """The quantized matmul kernels' shape: `tile` activation rows per tile; the weight types named
    in `narrow` (GGML type names, e.g. "Q4_K") run their full tiles on matmul_tiles_ir's rows."""

    tile: int = DEFAULT_TILE
    narrow: frozenset[str] = frozenset()

    def wide(self, wtype) -> bool:
        return wtype.name not in self.narrow

    def to_json(self) -> dict:
        return {"tile": self.tile, "narrow": sorted(self.narrow)}


def graph_weights(graph) -> set[tuple]:
    """(GGML type, K) of every quantized weight a generated kernel multiplies by."""
    from kinetic.ir.ops import Op

    found = set()
    for node in graph.nodes:
        if node.op is not Op.PARAM or len(node.type.shape) != 2:
            continue
        try:
            wtype = node.type.ggml_type
        except (KeyError, ValueError):
            continue
        if wtype in LAYOUTS:
            found.add((wtype, int(node.type.shape[1])))
    return found


def wide_types(weights: set[tuple], variant: str, tile: int) -> list[str]:
    """The type names among `weights` ((type, K) pairs) that have a wide path at `tile` on `variant`."""
    names = {wtype.name for wtype, k in weights
             if wide_ir.applies(LAYOUTS[wtype], variant, tile, k)
             or any(lanes.applies(LAYOUTS[wtype], variant, tile, k) for lanes in LANE_TILES)}
    return sorted(names)
