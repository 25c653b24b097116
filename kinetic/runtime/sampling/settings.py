"""Sampling settings: llama.cpp's names, meanings and CLI defaults, and the GGUF file's recommendations.

Every default below was checked against llama.cpp's `common/common.h` (`common_params_sampling`);
the field names are llama-server's JSON names (`temperature`, `typical_p`, `repeat_penalty`, ...),
which are also the names a receipt records.

Owns the one validation of sampling settings that the CLI, the Python API and the server share
(LIMITS, checked in SamplingSettings.__post_init__, and token_limit for max_tokens): each setting
takes exactly the values llama.cpp gives a meaning (its int32 ranges for counts, probabilities from
0 to 1, every float a finite 32-bit float); anything else raises SettingError, a ValueError naming the setting.
The server's OpenAI routes add the narrower OpenAI ranges on top (kinetic/server/params.py).
"""

from __future__ import annotations

import math
import numbers
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
SEED_MAX = 2**64 - 1  # PCG64 takes any 64-bit seed (llama.cpp's are 32-bit: a subset)
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1  # llama.cpp keeps counts and token ids in int32
FLOAT32_MAX = 3.4028234663852886e38  # and the rest in float: stof refuses anything larger


class SettingError(ValueError):
    """A sampling or generation setting out of its range: `setting` names it, `reason` says why
    ("must be from 0 to 1, not 2.0"); str() is both."""

    def __init__(self, setting: str, reason: str):
        super().__init__(f"{setting} {reason}")
        self.setting = setting
        self.reason = reason


@dataclass(frozen=True)
class Limit:
    """The values a numeric setting takes: int or float (a float is always finite), from lo to hi
    inclusive (None: unbounded); above: lo itself is excluded."""

    kind: type
    lo: float | None = None
    hi: float | None = None
    above: bool = False

    def describe(self) -> str:
        what = "an integer" if self.kind is int else "a number"
        if self.lo is not None and self.hi is not None:
            return f"{what} from {self.lo} to {self.hi}"
        if self.lo is not None:
            return f"{what} {'greater than' if self.above else 'at least'} {self.lo}"
        return what if self.kind is int else "a finite number"


# Every numeric setting and the values llama.cpp gives a meaning (common/arg.cpp, src/llama-sampling.cpp).
LIMITS: dict[str, Limit] = {
    "temperature": Limit(float),                     # <= 0: always the likeliest token
    "top_k": Limit(int, INT32_MIN, INT32_MAX),       # <= 0: every token
    "top_p": Limit(float, 0, 1),                     # 1: off
    "min_p": Limit(float, 0, 1),                     # 0: off
    "typical_p": Limit(float, 0, 1),                 # 1: off
    "top_n_sigma": Limit(float),                     # <= 0: off
    "repeat_penalty": Limit(float, 0, above=True),   # 1: off
    "repeat_last_n": Limit(int, -1, INT32_MAX),      # -1: the whole context
    "presence_penalty": Limit(float),
    "frequency_penalty": Limit(float),
    "dry_multiplier": Limit(float, 0),
    "dry_base": Limit(float, 1),
    "dry_allowed_length": Limit(int, 0, INT32_MAX),
    "dry_penalty_last_n": Limit(int, -1, INT32_MAX),
    "xtc_probability": Limit(float, 0, 1),
    "xtc_threshold": Limit(float, 0, 1),             # > 0.5: off
    "mirostat": Limit(int, 0, 2),
    "mirostat_tau": Limit(float, 0),                 # a target entropy in bits
    "mirostat_eta": Limit(float, 0),                 # a learning rate
}


@dataclass(frozen=True)
class SamplingSettings:
    """One request's sampler settings. Invalid values raise SettingError (a ValueError) naming the
    setting; numbers are stored as int or float (a numpy scalar or an int for a float is converted)."""

    temperature: float = 0.8          # <= 0: always the likeliest token
    top_k: int = 40                   # <= 0: all tokens
    top_p: float = 0.95               # 1: off (from 0 to 1)
    min_p: float = 0.05               # 0: off (from 0 to 1)
    typical_p: float = 1.0            # 1: off (from 0 to 1)
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
        for name, limit in LIMITS.items():
            object.__setattr__(self, name, checked(name, getattr(self, name), limit))
        object.__setattr__(self, "seed", _seed(self.seed))
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        object.__setattr__(self, "dry_sequence_breakers", _strings("dry_sequence_breakers", self.dry_sequence_breakers))
        samplers = _strings("samplers", self.samplers)
        object.__setattr__(self, "samplers", tuple(_canonical_sampler(n) for n in samplers))

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


def checked(name: str, value: Any, limit: Limit) -> int | float:
    """`value` as the limit's kind, or SettingError: no bools, no strings, floats finite."""
    integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if limit.kind is int and not integral:
        raise SettingError(name, f"must be {limit.describe()}, not {value!r}")
    if limit.kind is float and not (integral or isinstance(value, numbers.Real) and not isinstance(value, bool)):
        raise SettingError(name, f"must be {limit.describe()}, not {value!r}")
    try:
        number = int(value) if limit.kind is int else float(value)
    except OverflowError:  # an int too large for a double
        raise SettingError(name, f"must be {limit.describe()}, not {value!r}") from None
    if limit.kind is float and not (math.isfinite(number) and abs(number) <= FLOAT32_MAX):
        raise SettingError(name, f"must be finite (a 32-bit float, at most {FLOAT32_MAX:.4g} in size), not {value!r}")
    low = limit.lo is not None and (number <= limit.lo if limit.above else number < limit.lo)
    if low or (limit.hi is not None and number > limit.hi):
        raise SettingError(name, f"must be {limit.describe()}, not {value!r}")
    return number


def token_limit(value: Any, name: str = "max_tokens") -> int | None:
    """The most tokens to generate: None (no limit) for None or a negative count (llama.cpp's -1),
    else the count; anything but an integer raises SettingError."""
    if value is None:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise SettingError(name, f"must be an integer (-1 for no limit), not {value!r}")
    return None if value < 0 else int(value)


def _seed(value: Any) -> int | None:
    """None for a fresh seed (None or -1), else an integer from 0 to SEED_MAX."""
    if value is None:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise SettingError("seed", f"must be an integer, not {value!r}")
    if value == -1:
        return None
    if not 0 <= value <= SEED_MAX:
        raise SettingError("seed", f"must be from 0 to 2**64 - 1 (or -1 for a fresh one), not {value}")
    return int(value)


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """(token id, bias) pairs from pairs or a {token id: bias} mapping (ids as integers or their text);
    a bias is a finite number or -inf (a ban)."""
    pairs = value.items() if isinstance(value, Mapping) else value
    try:
        pairs = [(token, bias) for token, bias in pairs]
    except (TypeError, ValueError):
        raise SettingError("logit_bias", f"takes (token id, bias) pairs or a mapping, not {value!r}") from None
    out = []
    for token, bias in pairs:
        token_id = _token_id(token)
        if isinstance(bias, bool) or not isinstance(bias, numbers.Real) or math.isnan(bias) or bias == math.inf:
            raise SettingError("logit_bias", f"the bias of token {token_id} must be a number or -inf, not {bias!r}")
        out.append((token_id, float(bias)))
    return tuple(out)


def _token_id(value: Any) -> int:
    if isinstance(value, str) and value.strip().lstrip("+-").isdecimal() and len(value) < 32:
        value = int(value)
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise SettingError("logit_bias", f"token id {value!r} is not an integer")
    if value < 0:
        raise SettingError("logit_bias", f"token id {value} is negative")
    if value > INT32_MAX:
        raise SettingError("logit_bias", f"token id {value} is beyond any vocabulary (at most {INT32_MAX})")
    return int(value)


def _strings(name: str, value: Any) -> tuple[str, ...]:
    """A list of strings as a tuple (a single string is refused: it is not a list of them)."""
    try:
        items = tuple(value) if not isinstance(value, (str, bytes)) else None
    except TypeError:
        items = None
    if items is None or not all(isinstance(v, str) for v in items):
        raise SettingError(name, f"takes a list of strings, not {value!r}")
    return items


def _canonical_sampler(name: str) -> str:
    canonical = _ALIASES.get(name.lower())
    if canonical is None:
        raise SettingError("samplers", f"has an unknown sampler {name!r}; known: {', '.join(DEFAULT_SAMPLERS)}")
    return canonical


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
