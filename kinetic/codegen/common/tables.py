"""Per-pass tables a device uploads beside the rows: rotary cos/sin per position and the visibility
mask of a one-sequence pass, computed on the host once for every device.

Owns: `RopeTables` (cos and sin of one rotary key's angles, cached a block of positions at a time)
and `pass_mask` (which cache slots each row of a pass attends to). Does not own the rule of who sees
whom (kinetic/ir/rows.py: visibility) nor the angles' arithmetic (numerics.rope_angles): both are
the reference's, so a device reading these tables rotates and masks as the reference does.
"""

from __future__ import annotations

import numpy as np

from kinetic.codegen.common.libm import libm_map
from kinetic.ir import numerics
from kinetic.ir.rows import PassRows, visibility


class RopeTables:
    """cos and sin [rows, n_rot/2] of one rotary key's angles per position, as numerics.rope_cos_sin
    computes them (every scaling, the C library's cosf / sinf, times the magnitude mscale), made a
    block of positions at a time through the compiled map of the C library (libm.py): a decode step's
    new position costs nothing then. One table per distinct `Rotary` (RopeAttrs.rotary)."""

    BLOCK = 256

    def __init__(self, rotary: numerics.Rotary):
        self.rotary = rotary
        self.n_rot = rotary.n_rot
        self.mscale = numerics.rope_mscale(rotary)
        self.blocks: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def rows(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin f32 [len(positions), n_rot/2]."""
        first = positions // self.BLOCK
        for b in np.unique(first).tolist():
            if b not in self.blocks:
                self.blocks[b] = self._block(b)
        if len(positions) == 1:
            cos, sin = self.blocks[int(first[0])]
            at = int(positions[0]) % self.BLOCK
            return cos[at : at + 1], sin[at : at + 1]
        if len(positions) == 0:
            empty = np.zeros((0, self.n_rot // 2), np.float32)
            return empty, empty
        return tuple(np.stack([self.blocks[int(p) // self.BLOCK][i][int(p) % self.BLOCK] for p in positions])
                     for i in (0, 1))

    def _block(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        angles = numerics.rope_angles(np.arange(b * self.BLOCK, (b + 1) * self.BLOCK), self.rotary)
        cos, sin = libm_map("cosf", angles), libm_map("sinf", angles)
        if self.mscale != 1:  # cosf(theta) * mscale, as rope_yarn (a product by 1 changes nothing)
            cos, sin = (cos * self.mscale).astype(np.float32), (sin * self.mscale).astype(np.float32)
        return cos, sin


def pass_mask(rows: PassRows, committed_positions: np.ndarray, window: int) -> np.ndarray:
    """bool [T, n_committed + T] for a pass whose rows are all one sequence's: row i sees committed
    slot j (before the pass's own rows) and pass row j (slot n_committed + j) when visibility says so."""
    return visibility(rows, np.arange(len(rows.tokens)), np.asarray(committed_positions), window)
