"""Reading a family's hyperparameters from GGUF metadata, with clear errors for missing keys.

Owns: `<arch>.*` key lookup with defaults and type checks, and the rotary configuration (base,
dimensions, scaling type) shared by every family, including the refusal of scaling types the
interpreter does not apply yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kinetic.errors import KineticError
from kinetic.frontend.gguf_file import GGUFFile
from kinetic.ir.ops import RopeAttrs

_MISSING = object()


@dataclass(frozen=True)
class Decoder:
    """The hyperparameters every decoder family reads the same way."""

    n_layer: int
    n_embd: int
    n_head: int
    n_kv_head: int
    head_dim: int
    eps: float


def decoder(gguf: GGUFFile, *, default_eps: float) -> Decoder:
    n_embd = int(key(gguf, "embedding_length"))
    n_head = int(key(gguf, "attention.head_count"))
    return Decoder(
        n_layer=int(key(gguf, "block_count")),
        n_embd=n_embd,
        n_head=n_head,
        n_kv_head=int(key(gguf, "attention.head_count_kv", n_head)),
        head_dim=int(key(gguf, "attention.key_length", n_embd // n_head)),
        eps=float(key(gguf, "attention.layer_norm_rms_epsilon", default_eps)),
    )


def key(gguf: GGUFFile, suffix: str, default: Any = _MISSING) -> Any:
    """`<architecture>.<suffix>`; without a default a missing key is an error naming it."""
    name = f"{gguf.architecture}.{suffix}"
    value = gguf.metadata.get(name, default)
    if value is _MISSING:
        raise KineticError(
            f"{gguf.path.name} lacks the metadata key {name}",
            "The file is incomplete or was converted for another architecture; get a complete file.",
        )
    if hasattr(value, "tolist"):
        value = value.tolist()
    return value


def per_layer(value: Any, n_layer: int) -> list:
    """A hyperparameter that may be one value or one per layer."""
    if isinstance(value, list):
        if len(value) != n_layer:
            raise KineticError(f"a per-layer value has {len(value)} entries for {n_layer} layers",
                               "The file is damaged; get a complete file.")
        return value
    return [value] * n_layer


def rope(gguf: GGUFFile, *, n_head: int, head_dim: int, neox: bool, theta: float | None = None) -> RopeAttrs:
    """The rotary configuration; linear scaling is applied, other scaling types are refused."""
    n_rot = int(key(gguf, "rope.dimension_count", head_dim))
    base = float(theta if theta is not None else key(gguf, "rope.freq_base", 10000.0))
    scaling = key(gguf, "rope.scaling.type", "none")
    factor = float(key(gguf, "rope.scaling.factor", 0.0) or 0.0)
    if "rope_freqs.weight" in gguf.tensors:
        scaling = "llama3"
    if scaling in ("none", "") or (scaling == "linear" and factor in (0.0, 1.0)):
        return RopeAttrs(n_head, head_dim, n_rot, base, neox)
    if scaling == "linear":
        return RopeAttrs(n_head, head_dim, n_rot, base, neox, freq_scale=1.0 / factor)
    raise KineticError(
        f"{scaling} rotary scaling is not supported yet",
        "Use a model without rotary scaling, or run it with llama.cpp for now.",
    )
