"""Sampling settings: llama.cpp's names, meanings and CLI defaults, and the GGUF file's recommendations.

Every default below was checked against llama.cpp's `common/common.h` (`common_params_sampling`);
the field names are llama-server's JSON names (`temperature`, `typical_p`, `repeat_penalty`, ...),
which are also the names a receipt records.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

# llama.cpp's default order (common.h `samplers`), by its canonical names (common/sampling.cpp
# `common_sampler_types_from_names`). Logit bias always runs first and is not part of the order.
DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")

# The aliases llama.cpp accepts for each canonical name: kebab-case, no underscore, and a few extras.
_ALIASES = {"nucleus": "top_p", "temp": "temperature", "typ": "typ_p"}
for _name in DEFAULT_SAMPLERS:
    _ALIASES[_name] = _name
    _ALIASES[_name.replace("_", "-")] = _name
    _ALIASES[_name.replace("_", "")] = _name

DEFAULT_DRY_BREAKERS = ("\n", ":", '"', "*")
RANDOM_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: "pick a fresh seed", as llama.cpp spells it (-1 too)


@dataclass(frozen=True)
class SamplingSettings:
    """One request's sampler settings. Invalid values raise ValueError naming the setting."""

    temperature: float = 0.8          # <= 0: always the likeliest token
    top_k: int = 40                   # <= 0: all tokens
    top_p: float = 0.95               # >= 1: off
    min_p: float = 0.05               # <= 0: off
    typical_p: float = 1.0            # >= 1: off
    top_n_sigma: float = -1.0         # <= 0: off
    repeat_penalty: float = 1.0       # 1: off
    repeat_last_n: int = 64           # 0: off; -1: the whole context
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0       # 0: off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64      # 0: off; -1: the whole context (common.h's default is 64)
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_DRY_BREAKERS
    xtc_probability: float = 0.0      # 0: off
    xtc_threshold: float = 0.1        # > 0.5: off
    mirostat: int = 0                 # 0: off; 1 or 2 replace the chain after temperature
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, bias) pairs; a dict is accepted
    seed: int | None = None           # None, -1 or 0xFFFFFFFF: a fresh seed per Sampler
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS

    def __post_init__(self) -> None:
        bias = self.logit_bias.items() if isinstance(self.logit_bias, Mapping) else self.logit_bias
        object.__setattr__(self, "logit_bias", tuple((_token_id(t), float(b)) for t, b in bias))
        object.__setattr__(self, "dry_sequence_breakers", tuple(str(b) for b in self.dry_sequence_breakers))
        object.__setattr__(self, "samplers", tuple(_canonical_sampler(n) for n in self.samplers))
        if self.seed is not None and self.seed < 0:
            object.__setattr__(self, "seed", None if self.seed == -1 else self.seed)
        _validate(self)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def random_seed(self) -> bool:
        return self.seed is None or self.seed == RANDOM_SEED

    def as_dict(self) -> dict[str, Any]:
        """The settings as a receipt records them (logit_bias as {id: bias}, tuples as lists)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "logit_bias":
                value = {str(t): b for t, b in value}
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out


def _token_id(value: Any) -> int:
    token = int(value)
    if token != value and not isinstance(value, str):
        raise ValueError(f"logit_bias: token id {value!r} is not an integer")
    return token


def _canonical_sampler(name: str) -> str:
    canonical = _ALIASES.get(str(name).lower())
    if canonical is None:
        raise ValueError(f"samplers: unknown sampler {name!r}; known: {', '.join(DEFAULT_SAMPLERS)}")
    return canonical


def _validate(s: SamplingSettings) -> None:
    """The ranges llama.cpp enforces (common/arg.cpp, tools/server/server-schema.cpp)."""
    floats = ("temperature", "top_p", "min_p", "typical_p", "top_n_sigma", "repeat_penalty", "presence_penalty",
              "frequency_penalty", "dry_multiplier", "dry_base", "xtc_probability", "xtc_threshold",
              "mirostat_tau", "mirostat_eta")
    for name in floats:
        value = getattr(s, name)
        if not isinstance(value, (int, float)) or math.isnan(value):
            raise ValueError(f"{name} must be a number, not {value!r}")
        if math.isinf(value) and name != "temperature":
            raise ValueError(f"{name} must be finite, not {value!r}")
    for name in ("top_k", "repeat_last_n", "dry_allowed_length", "dry_penalty_last_n", "mirostat"):
        if not isinstance(getattr(s, name), int):
            raise ValueError(f"{name} must be an integer, not {getattr(s, name)!r}")
    if s.repeat_penalty <= 0:
        raise ValueError(f"repeat_penalty must be greater than 0 (1 for none), not {s.repeat_penalty}")
    if s.repeat_last_n < -1 or s.dry_penalty_last_n < -1:
        raise ValueError("repeat_last_n and dry_penalty_last_n take a count, 0 for none or -1 for the whole context")
    if s.dry_multiplier < 0:
        raise ValueError(f"dry_multiplier must be 0 (none) or more, not {s.dry_multiplier}")
    if s.dry_base < 1:
        raise ValueError(f"dry_base must be at least 1, not {s.dry_base}")
    if s.dry_allowed_length < 0:
        raise ValueError(f"dry_allowed_length must be 0 or more, not {s.dry_allowed_length}")
    if not 0 <= s.xtc_probability <= 1:
        raise ValueError(f"xtc_probability must be between 0 and 1, not {s.xtc_probability}")
    if s.mirostat not in (0, 1, 2):
        raise ValueError(f"mirostat must be 0 (off), 1 or 2, not {s.mirostat}")
    if s.seed is not None and not 0 <= s.seed < 2**64:
        raise ValueError(f"seed must be between 0 and 2**64 - 1 (or -1 for a fresh one), not {s.seed}")
    for token, bias in s.logit_bias:
        if token < 0:
            raise ValueError(f"logit_bias: token id {token} is negative")
        if math.isnan(bias) or bias == math.inf:
            raise ValueError(f"logit_bias: the bias of token {token} must be a number or -inf, not {bias}")


# -- the GGUF file's recommended settings ----------------------------------------------------------------

# general.sampling.* keys llama.cpp reads (src/llama-arch.cpp LLM_KV_GENERAL_SAMPLING_*,
# applied in common/common.cpp), mapped to our field names, with how each value parses.
METADATA_KEYS = {
    "general.sampling.top_k": ("top_k", int),
    "general.sampling.top_p": ("top_p", float),
    "general.sampling.min_p": ("min_p", float),
    "general.sampling.xtc_probability": ("xtc_probability", float),
    "general.sampling.xtc_threshold": ("xtc_threshold", float),
    "general.sampling.temp": ("temperature", float),
    "general.sampling.penalty_last_n": ("repeat_last_n", int),
    "general.sampling.penalty_repeat": ("repeat_penalty", float),
    "general.sampling.mirostat": ("mirostat", int),
    "general.sampling.mirostat_tau": ("mirostat_tau", float),
    "general.sampling.mirostat_eta": ("mirostat_eta", float),
}
SEQUENCE_KEY = "general.sampling.sequence"  # sampler names separated by ';'

_INT_PREFIX = re.compile(r"\s*[+-]?\d+")
_FLOAT_PREFIX = re.compile(r"\s*[+-]?(?:inf(?:inity)?|nan|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)", re.IGNORECASE)


def settings_from_metadata(metadata: Mapping[str, Any], base: SamplingSettings | None = None) -> SamplingSettings:
    """`base` (llama.cpp's defaults) with the file's general.sampling.* values where it has them.

    Values are read as llama.cpp reads them: the value's text, parsed like strtol/strtof (a leading
    number counts); a key whose value does not parse, or gives an invalid setting, is skipped.
    Sampler names in general.sampling.sequence that Kinetic does not know are skipped, as llama.cpp
    skips them with a warning.
    """
    settings = base or SamplingSettings()
    for key, (name, kind) in METADATA_KEYS.items():
        value = _parse_number(metadata.get(key), kind)
        if value is None:
            continue
        try:
            settings = replace(settings, **{name: value})
        except ValueError:
            continue
    sequence = metadata.get(SEQUENCE_KEY)
    if isinstance(sequence, str):
        names = [n.strip().lower() for n in sequence.split(";")]
        known = tuple(_ALIASES[n] for n in names if n in _ALIASES)
        if known:
            settings = replace(settings, samplers=known)
    return settings


def _parse_number(value: Any, kind: type) -> int | float | None:
    if value is None or isinstance(value, (bool, list, tuple, dict)):
        return None
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    match = (_INT_PREFIX if kind is int else _FLOAT_PREFIX).match(text)
    if match is None:
        return None
    return kind(match.group().strip())
