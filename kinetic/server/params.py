"""API fields to sampler settings: one reader for the three APIs, with llama-server's names.

Owns: which request fields set which SamplingSettings field (OpenAI's, llama-server's and Ollama's
spellings), the ranges the OpenAI routes enforce (temperature 0..100, top_p 0..1, penalties -2..2,
logit_bias -100..100; docs/server.md's field table) on top of the ranges every caller shares,
logit_bias in its two shapes, and turning a settings error into a 400 that names the field. Fields
Kinetic has no sampler for (dynatemp, min_keep, ...) are ignored, as llama-server ignores what it
does not know. Does not own
the ranges themselves: those are kinetic/runtime/sampling/settings.py's LIMITS, the one validation
the CLI and the Python API use too.
"""

from __future__ import annotations

import math
from dataclasses import replace

from kinetic.runtime.sampling import SamplingSettings
from kinetic.runtime.sampling.settings import LIMITS, SEED_MAX, SettingError
from kinetic.server.body import Fields
from kinetic.server.errors import ApiError

# Other spellings clients send for the same setting (request field -> settings field).
_ALIASES = {"repetition_penalty": "repeat_penalty", "typical": "typical_p", "top_nsigma": "top_n_sigma",
            "penalty_last_n": "repeat_last_n"}

# The ranges the OpenAI routes enforce (docs/server.md's field table), within LIMITS; llama-server and Ollama
# routes take everything LIMITS allows.
OPENAI_RANGES = {"temperature": (0.0, 100.0), "top_p": (0.0, 1.0), "min_p": (0.0, 1.0),
                 "presence_penalty": (-2.0, 2.0), "frequency_penalty": (-2.0, 2.0)}


def sampling_settings(f: Fields, base: SamplingSettings, n_vocab: int, strict: bool = False,
                      seed_field: str = "seed") -> SamplingSettings:
    """`base` with every sampler field `f` sets. strict: the OpenAI ranges."""
    changes: dict = {}
    asked: dict[str, str] = {}  # settings field -> the request field that set it
    for name in (*LIMITS, *_ALIASES):
        target = _ALIASES.get(name, name)
        value = f.integer(name) if LIMITS[target].kind is int else f.number(name, *_bounds(target, strict))
        if value is not None:
            changes[target], asked[target] = value, name
    seed = f.integer(seed_field, lo=-1, hi=SEED_MAX)
    if seed is not None:
        changes["seed"], asked["seed"] = seed, seed_field
    if f.has("dry_sequence_breakers"):  # llama.cpp reads at most 40 characters of each
        changes["dry_sequence_breakers"] = f.strings("dry_sequence_breakers", most=64, longest=40, single=False)
    if f.has("samplers"):  # names only (llama-server also takes a string of one-letter codes)
        changes["samplers"] = f.strings("samplers", most=32, longest=40, single=False)
    if f.has("logit_bias"):
        changes["logit_bias"] = logit_bias(f, n_vocab, strict)
    try:
        return replace(base, **changes)
    except SettingError as e:  # what the bounds above leave to LIMITS: integer ranges, repeat_penalty 0, ...
        field = f.prefix + asked.get(e.setting, e.setting)
        raise ApiError(400, f"{field} {e.reason}", param=field) from None


def _bounds(target: str, strict: bool) -> tuple[float | None, float | None]:
    """The shared limit of a setting, narrowed to the OpenAI range when strict."""
    limit = LIMITS[target]
    lo, hi = limit.lo, limit.hi
    if strict and target in OPENAI_RANGES:
        low, high = OPENAI_RANGES[target]
        lo, hi = (low if lo is None else max(lo, low)), (high if hi is None else min(hi, high))
    return lo, hi


def logit_bias(f: Fields, n_vocab: int, strict: bool) -> tuple[tuple[int, float], ...]:
    """{"token id": bias} (OpenAI, llama-server) or [[id, bias], ...] with false for a ban (llama-server)."""
    value = f.raw("logit_bias")
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 for p in value):
        pairs = [tuple(p) for p in value]
    else:
        raise f.bad("logit_bias", 'an object {"token id": bias}')
    out = []
    for token, bias in pairs:
        try:
            token_id = int(token)
            if isinstance(token, float) or isinstance(token, bool) or str(token_id) != str(token).strip():
                raise ValueError
        except (TypeError, ValueError):
            raise ApiError(400, f"{f.prefix}logit_bias: {token!r} is not a token id", param="logit_bias") from None
        if not 0 <= token_id < n_vocab:
            raise ApiError(400, f"{f.prefix}logit_bias: token id {token_id} is outside the vocabulary "
                                f"(0..{n_vocab - 1})", param="logit_bias")
        if bias is False:
            bias = -math.inf
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or math.isnan(bias) or bias == math.inf:
            raise ApiError(400, f"{f.prefix}logit_bias: the bias of token {token_id} must be a number",
                           param="logit_bias")
        if strict and not -100 <= bias <= 100:
            raise ApiError(400, f"logit_bias: the bias of token {token_id} must be from -100 to 100, not {bias}",
                           param="logit_bias")
        out.append((token_id, float(bias)))
    return tuple(out)
