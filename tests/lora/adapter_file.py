"""Random low-rank LoRA adapters in llama.cpp's GGUF adapter format, made from a seed (nothing committed).

Owns: writing an adapter file for a base model with the gguf package (general.type = adapter,
adapter.type = lora, adapter.lora.alpha, `<weight>.lora_a` f32 [rank, n_in] and `<weight>.lora_b`
f32 [n_out, rank]). The reference tokens in tests/data/lora/ were recorded from llama-server with the
file this writes for SMOLLM2_ADAPTER (scripts/record_lora_reference.py); its BLAKE3 is stored beside
them, so a change in what this writes fails the tests instead of comparing against another adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from kinetic.frontend.gguf_file import open_gguf


@dataclass(frozen=True)
class AdapterRecipe:
    targets: tuple[str, ...]  # weight names without "blk.N." and ".weight": attn_q, ffn_down, ...
    rank: int = 8
    alpha: float = 16.0
    spread: float = 0.06  # standard deviation of B's entries (A's is 1/sqrt(n_in))
    seed: int = 27
    architecture: str | None = None  # None: the base model's


SMOLLM2_ADAPTER = AdapterRecipe(targets=("attn_q", "attn_v", "ffn_down"))


def write_adapter(base_path: Path, out: Path, recipe: AdapterRecipe) -> Path:
    """An adapter for every layer's `recipe.targets` of the model at `base_path`, written to `out`."""
    base = open_gguf(base_path)
    rng = np.random.default_rng(recipe.seed)
    writer = gguf.GGUFWriter(str(out), recipe.architecture or base.architecture)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", recipe.alpha)
    for name, info in base.tensors.items():
        if not _targeted(name, recipe.targets):
            continue
        n_out, n_in = info.shape
        a = rng.standard_normal((recipe.rank, n_in)).astype(np.float32) / np.float32(np.sqrt(n_in))
        b = (rng.standard_normal((n_out, recipe.rank)) * recipe.spread).astype(np.float32)
        writer.add_tensor(name.removesuffix(".weight") + ".weight.lora_a", a)
        writer.add_tensor(name.removesuffix(".weight") + ".weight.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _targeted(name: str, targets: tuple[str, ...]) -> bool:
    parts = name.split(".")
    return len(parts) == 4 and parts[0] == "blk" and parts[2] in targets and parts[3] == "weight"
