"""What a family descriptor is: the architectures it answers to and how it builds a graph."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kinetic.frontend.blocks import Blocks


@dataclass(frozen=True)
class Family:
    name: str
    architectures: tuple[str, ...]
    build: Callable[[Blocks], int]  # builds every layer and the head; returns the logits node
