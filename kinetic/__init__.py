"""Kinetic: runs GGUF language models as a compiler (see docs/ and the README).

    import kinetic
    model = kinetic.Model("smollm2-135m")
    print(model.generate("The capital of France is", max_tokens=8))
"""

from __future__ import annotations

from kinetic.errors import KineticError

__version__ = "0.1.0"

__all__ = ["KineticError", "Model", "__version__"]


def __getattr__(name: str):
    # Model pulls in numpy and the runtime; importing it lazily keeps `kinetic info` instant.
    if name == "Model":
        from kinetic.model import Model

        return Model
    raise AttributeError(f"module 'kinetic' has no attribute {name!r}")
