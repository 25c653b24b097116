"""Which layers of a file use sliding-window attention, by llama.cpp's rule (load_swa_pattern in
src/llama-model.cpp and set_swa_pattern in src/llama-hparams.cpp).

Owns: reading `<arch>.attention.sliding_window_pattern`, which is either an array of one boolean per
layer (true = the layer slides; what the converters write) or one integer n (layer il slides unless
il % n == n - 1; 0 means every layer slides), and the family's default n when the key is absent.
Does not own whether a family uses windows at all, or the window's size (the families decide, since
llama.cpp's rules differ per architecture: olmo2 when the file gives a window, exaone4 only for
64-layer models).
"""

from __future__ import annotations

from kinetic.errors import ModelFileError
from kinetic.frontend import hparams as hp
from kinetic.frontend.gguf_file import GGUFFile

PATTERN_KEY = "attention.sliding_window_pattern"


def sliding_layers(gguf: GGUFFile, *, n_layer: int, default_period: int) -> tuple[bool, ...]:
    """For each layer whether it slides: the file's per-layer booleans, or its period, or the
    family's default period (every period-th layer, counting from 1, is global)."""
    value = gguf.metadata.get(f"{gguf.architecture}.{PATTERN_KEY}")
    if hasattr(value, "__len__") and not isinstance(value, str):
        return hp.per_layer(gguf, PATTERN_KEY, n_layer=n_layer)
    period = default_period
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= hp.MAX_LAYERS:
            raise ModelFileError(gguf.path.name, f"{gguf.architecture}.{PATTERN_KEY}", f"is {value}",
                                    f"one boolean per layer, or a period from 0 to {hp.MAX_LAYERS}")
        period = value
    elif value is not None:
        return hp.per_layer(gguf, PATTERN_KEY, n_layer=n_layer)  # one boolean for every layer (or refused)
    return tuple(period == 0 or il % period < period - 1 for il in range(n_layer))


def describe(sliding: tuple[bool, ...], window: int) -> str:
    """`kinetic info`'s line: "window 4096 on 48 of 64 layers; global: 3, 7, ..."."""
    if not any(sliding):
        return "none"
    glob = [str(il) for il, s in enumerate(sliding) if not s]
    shown = ", ".join(glob[:8]) + (", ..." if len(glob) > 8 else "")
    return f"{window} positions on {sum(sliding)} of {len(sliding)} layers; global layers: {shown or 'none'}"
