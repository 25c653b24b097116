"""Sampling: llama.cpp's sampler chain, with one uniform random number per generated token.

Owns: the settings (llama.cpp's names and defaults, and the GGUF file's general.sampling.*
recommendations), each sampler as a pure function over candidate token ids and logits, and the
Sampler that runs the chain for one sequence and holds its state (history for the penalties and
DRY, Mirostat's mu, the seeded generator). Does not own: logits (the engine), token text (the
tokenizer hands DRY the vocabulary's pieces), or which tokens to draft (speculative decoding calls
Sampler.choose to verify). User-facing description: docs/sampling.md.
"""

from kinetic.runtime.sampling.filters import log_softmax, top_logprobs
from kinetic.runtime.sampling.sampler import Sampler, SamplerState, fresh_seed
from kinetic.runtime.sampling.settings import (
    DEFAULT_DRY_BREAKERS,
    DEFAULT_SAMPLERS,
    METADATA_KEYS,
    SamplingSettings,
    settings_from_metadata,
)

__all__ = [
    "DEFAULT_DRY_BREAKERS", "DEFAULT_SAMPLERS", "METADATA_KEYS", "Sampler", "SamplerState", "SamplingSettings",
    "fresh_seed", "log_softmax", "settings_from_metadata", "top_logprobs",
]
