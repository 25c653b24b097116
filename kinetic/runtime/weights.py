"""Weights straight from the memory-mapped GGUF file (the interpreter's WeightSource)."""

from __future__ import annotations

import numpy as np

from kinetic.frontend.gguf_file import GGUFFile


class GGUFWeights:
    def __init__(self, gguf: GGUFFile):
        self.gguf = gguf

    def tensor(self, name: str) -> np.ndarray:
        return self.gguf.array(name)
