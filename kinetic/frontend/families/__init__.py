"""The family registry: GGUF `general.architecture` names -> family descriptors.

Adding a family is one file in this folder plus one line in FAMILIES.
"""

from __future__ import annotations

from kinetic.errors import KineticError
from kinetic.frontend.families import (
    bert,
    ernie4_5,
    exaone4,
    falcon_h1,
    gemma3,
    gemma4,
    granite,
    granitehybrid,
    granitemoe,
    hunyuan_dense,
    lfm2,
    lfm2moe,
    llama,
    nomic_bert,
    olmo2,
    qwen2,
    qwen3,
    qwen3moe,
    qwen35,
    qwen35moe,
)
from kinetic.frontend.families.base import Family

FAMILIES: tuple[Family, ...] = (
    llama.FAMILY,
    gemma3.FAMILY,
    gemma4.FAMILY,
    qwen2.FAMILY,
    qwen3.FAMILY,
    ernie4_5.FAMILY,
    hunyuan_dense.FAMILY,
    granite.FAMILY,
    olmo2.FAMILY,
    exaone4.FAMILY,
    lfm2.FAMILY,
    granitehybrid.FAMILY,
    falcon_h1.FAMILY,
    qwen35.FAMILY,
    qwen3moe.FAMILY,
    granitemoe.FAMILY,
    lfm2moe.FAMILY,
    qwen35moe.FAMILY,
    bert.FAMILY,
    nomic_bert.FAMILY,
)

_BY_ARCH = {arch: f for f in FAMILIES for arch in f.architectures}


def supported_architectures() -> set[str]:
    return set(_BY_ARCH)


def family_for(architecture: str) -> Family:
    try:
        return _BY_ARCH[architecture]
    except KeyError:
        raise KineticError(
            f"architecture {architecture} is not supported yet",
            "Run `kinetic info` on the file to see what it holds; supported: "
            + ", ".join(sorted(_BY_ARCH)) + ".",
        ) from None
