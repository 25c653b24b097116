"""The GGUF models already on this computer: Kinetic's folder, Ollama's, LM Studio's, the Hugging
Face cache and llama.cpp's cache, by the names each tool gives them.

Owns: listing them (`discover`), looking a name up (`find`: the rules below), and what a model's
header says about it (`facts`: architecture, quantization, context, whether Kinetic runs it, read
from the header only). Does not own where each store is or how its names are made
(kinetic.stores.layouts), nor turning a command's argument into a file (kinetic.hub.resolve_model,
the one resolver, which calls `find`).

Lookup, case-insensitive, the first store in order (Kinetic, Ollama, LM Studio, Hugging Face,
llama.cpp) that has the name wins:
* the exact name (`qwen3:4b`, `org/repo:Q4_K_M`, a file's stem, or a file name with .gguf);
* an Ollama name without a tag: its `latest` tag, else its only tag;
* `org/repo` without a quantization: the repository's only model (several: an error listing them).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from kinetic.errors import KineticError
from kinetic.stores.layouts import Found, Locations, scan_all

__all__ = ["Facts", "Found", "Locations", "closest", "discover", "facts", "find"]


@dataclass(frozen=True)
class Facts:
    """What a model's header says, for `kinetic models` and `kinetic fit`."""

    architecture: str | None
    quant: str | None
    context_length: int | None
    runs: bool
    why_not: str | None  # why Kinetic cannot run it, when it cannot


def discover(where: Locations | None = None) -> list[Found]:
    """Every model in every store (see kinetic.stores.layouts), in lookup order."""
    return scan_all(where or Locations.from_environment())


def find(name: str, where: Locations | None = None, found: list[Found] | None = None) -> Found | None:
    """The model `name` names (the rules in this module's docstring), or None."""
    found = discover(where) if found is None else found
    key = name.lower()
    for rule in (_exact, _ollama_untagged, _repo_alone):
        hit = rule(key, found)
        if hit is not None:
            return hit
    return None


def closest(name: str, found: list[Found], n: int = 5) -> list[str]:
    """The names most like `name`, for a name that matches nothing."""
    names = list(dict.fromkeys(f.name for f in found))
    by_lower = {x.lower(): x for x in names}
    return [by_lower[x] for x in difflib.get_close_matches(name.lower(), list(by_lower), n=n, cutoff=0.5)]


def _exact(key: str, found: list[Found]) -> Found | None:
    for f in found:
        if key in (f.name.lower(), f.path.name.lower(), f.path.stem.lower()) and (
                f.name.lower() == key or f.source != "ollama"):  # Ollama's blobs are named by hash only
            return f
    return None


def _ollama_untagged(key: str, found: list[Found]) -> Found | None:
    if ":" in key:
        return None
    tags = [f for f in found if f.source == "ollama" and f.name.lower().rsplit(":", 1)[0] == key]
    latest = [f for f in tags if f.name.lower().endswith(":latest")]
    return latest[0] if latest else tags[0] if len(tags) == 1 else None


def _repo_alone(key: str, found: list[Found]) -> Found | None:
    if ":" in key or key.count("/") != 1:
        return None
    for source in dict.fromkeys(f.source for f in found):
        models = [f for f in found if f.source == source and f.name.lower().split(":", 1)[0] == key]
        if len(models) == 1:
            return models[0]
        if models:
            raise KineticError(
                f"{key} holds {len(models)} models in {source}'s store: " + ", ".join(m.name for m in models),
                "Name one of them, for example `" + models[0].name + "`.",
            )
    return None


def facts(model: Found) -> Facts:
    """What the header of `model` says; a file that does not read is a model Kinetic cannot run."""
    if model.split_count > 1:
        return Facts(None, model.quant, None, False,
                     f"split into {model.split_count} files ({len(model.parts)} here); join them with "
                     "llama-gguf-split --merge")
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.frontend.model_info import describe

    try:
        gguf = open_gguf(model.path)
        info = describe(gguf)
    except KineticError as exc:
        return Facts(None, model.quant, None, False, exc.message)
    quant = _file_type(gguf.metadata.get("general.file_type")) or model.quant
    why_not = None
    if not info.supported:
        why_not = f"architecture {info.architecture or 'unknown'} is not supported yet"
    elif not info.tokenizer.supported:
        why_not = f"tokenizer {info.tokenizer.model}/{info.tokenizer.pre} is not supported yet"
    return Facts(info.architecture, quant, info.context_length, why_not is None, why_not)


def _file_type(code) -> str | None:
    """llama.cpp's name for general.file_type (15 -> Q4_K_M), None when absent or unknown."""
    from gguf import LlamaFileType

    if not isinstance(code, int) or isinstance(code, bool):
        return None
    try:
        name = LlamaFileType(code).name
    except ValueError:
        return None
    return None if name == "GUESSED" else name.removeprefix("MOSTLY_").removeprefix("ALL_")
