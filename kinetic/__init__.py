"""Kinetic: runs GGUF language models as a compiler (see docs/ and the README)."""

from __future__ import annotations

from kinetic.errors import KineticError

__version__ = "0.1.0"

__all__ = ["KineticError", "__version__"]
