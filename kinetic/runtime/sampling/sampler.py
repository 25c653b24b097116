"""The Sampler: one sequence's sampler chain with its state (history, Mirostat's mu, the generator).

The calls, and the only way tokens are sampled (plain decoding and speculative verification alike):

    u = sampler.next_uniform()        # the i-th uniform of the seed's stream, one per generated token
    token = sampler.choose(logits, u) # pure: the chain over this row's logits, then the pick by u
    sampler.accept(token)             # advance: history (penalties, DRY) and Mirostat's mu

`choose` changes nothing, so a verifier can ask it whether a drafted token x is the token plain
decoding would take at that index (same logits, same state, same u). Every token, greedy ones
included, consumes exactly one uniform, so the i-th token always uses the i-th uniform whatever the
settings. The stream is numpy's `Generator(PCG64(seed)).random()`: doubles in [0, 1).
"""

from __future__ import annotations

import copy
import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kinetic.runtime.sampling import filters as f
from kinetic.runtime.sampling.dry import BreakerIndex, dry
from kinetic.runtime.sampling.mirostat import mirostat_v1, mirostat_v2, surprise
from kinetic.runtime.sampling.settings import RANDOM_SEED, SamplingSettings


@dataclass(frozen=True)
class SamplerState:
    """What snapshot() saves and restore() puts back."""

    history: tuple[int, ...]
    mu: float
    rng: dict[str, Any]
    drawn: int


def _argmax_only(s: SamplingSettings) -> bool:
    """Whether choose() is the plain argmax of the raw logits: greedy, and no stage before the
    temperature can change which token is likeliest (bias, penalties and DRY change logits; typical
    and XTC can drop the best token; the other filters always keep it)."""
    return (s.greedy and s.mirostat == 0 and "temperature" in s.samplers and not s.logit_bias
            and (s.typical_p >= 1 or "typ_p" not in s.samplers)
            and (s.xtc_probability <= 0 or s.xtc_threshold > 0.5 or "xtc" not in s.samplers))


def fresh_seed() -> int:
    """A seed for a request that gave none (recorded in the Sampler's settings, so it can be replayed)."""
    return secrets.randbelow(RANDOM_SEED)


class Sampler:
    """One sequence's sampler: `Sampler(settings, vocab_pieces, n_vocab=..., history=prompt_ids)`.

    vocab_pieces (each token's text, bytes or str) is needed only for DRY's sequence breakers.
    history is the context so far (the prompt): llama.cpp's CLI and server feed it to the penalties
    and DRY too.
    """

    def __init__(self, settings: SamplingSettings | None = None, vocab_pieces: Sequence[bytes | str] | None = None,
                 *, n_vocab: int | None = None, history: Sequence[int] = ()):
        settings = settings or SamplingSettings()
        if settings.random_seed:
            settings = replace(settings, seed=fresh_seed())
        self.settings = settings
        self._rng = np.random.Generator(np.random.PCG64(settings.seed))
        self._drawn = 0
        self._mu = 2.0 * settings.mirostat_tau  # llama.cpp resets mu to 2 * tau
        s = settings
        penalties_on = s.repeat_last_n != 0 and (s.repeat_penalty != 1 or s.frequency_penalty != 0
                                                 or s.presence_penalty != 0)
        dry_on = s.dry_multiplier != 0 and s.dry_penalty_last_n != 0
        self._penalty_n = (s.repeat_last_n if penalties_on else 0) if s.mirostat == 0 else 0
        self._dry_n = (s.dry_penalty_last_n if dry_on else 0) if s.mirostat == 0 else 0
        self._keep = None if -1 in (self._penalty_n, self._dry_n) else max(self._penalty_n, self._dry_n)
        self._history = [int(t) for t in history]
        self._trim()
        self._breakers = None
        if self._dry_n and "dry" in s.samplers:
            if vocab_pieces is None:
                raise ValueError("DRY needs the vocabulary's token pieces (vocab_pieces) to match sequence breakers")
            self._breakers = BreakerIndex.cached(vocab_pieces, s.dry_sequence_breakers)
        self._bias_tokens = np.array([t for t, _ in s.logit_bias], dtype=np.int64)
        self._bias_values = np.array([b for _, b in s.logit_bias], dtype=np.float64)
        if n_vocab is not None and len(self._bias_tokens) and self._bias_tokens.max() >= n_vocab:
            raise ValueError(f"logit_bias: token id {int(self._bias_tokens.max())} is outside the vocabulary "
                             f"(0..{n_vocab - 1})")
        self._argmax_only = _argmax_only(s) and not self._penalty_n and not self._dry_n
        self._ids: np.ndarray | None = None
        self._last_choice: tuple[int, float] | None = None  # Mirostat: (token, surprise) of the last choose()

    @property
    def seed(self) -> int:
        return int(self.settings.seed)

    @property
    def drawn(self) -> int:
        """How many uniforms have been drawn (= tokens sampled so far)."""
        return self._drawn

    # -- the three calls -------------------------------------------------------------------------

    def next_uniform(self) -> float:
        """The next uniform in [0, 1) of the seed's stream."""
        self._drawn += 1
        return float(self._rng.random())

    def choose(self, logits: np.ndarray, u: float) -> int:
        """The token the chain gives for this row of logits (f32 [n_vocab]) and uniform u. Changes no
        sampling state (with Mirostat it only remembers the token's surprise for accept())."""
        row = np.asarray(logits)
        if row.ndim != 1 or not len(row):
            raise ValueError(f"choose() takes one row of logits, not shape {row.shape}")
        if self._argmax_only:
            return int(np.argmax(row))
        ids, z, u = self.chain(row, u)
        token = f.pick(ids, z, u)
        if self.settings.mirostat:
            self._last_choice = (token, surprise(ids, z, token))
        return token

    def accept(self, token: int, logits: np.ndarray | None = None) -> None:
        """Advance the state past `token`. With Mirostat, mu moves by the token's surprise: from
        `logits` when given, else from the last choose() that returned this token."""
        token = int(token)
        s = self.settings
        if s.mirostat:
            if logits is not None:
                ids, z, _ = self.chain(np.asarray(logits), 0.0)
                seen = surprise(ids, z, token)
            elif self._last_choice is not None and self._last_choice[0] == token:
                seen = self._last_choice[1]
            else:
                raise ValueError("with Mirostat, accept() needs the row's logits, or must follow the choose() "
                                 "that returned the token")
            if math.isfinite(seen):
                self._mu -= s.mirostat_eta * (seen - s.mirostat_tau)
        self._last_choice = None
        if self._keep != 0:
            self._history.append(token)
            self._trim()

    def sample(self, logits: np.ndarray) -> int:
        """Plain decoding of one token: exactly next_uniform, choose, accept."""
        token = self.choose(logits, self.next_uniform())
        self.accept(token)
        return token

    # -- state -------------------------------------------------------------------------------------

    def snapshot(self) -> SamplerState:
        return SamplerState(tuple(self._history), self._mu, copy.deepcopy(self._rng.bit_generator.state),
                            self._drawn)

    def restore(self, state: SamplerState) -> None:
        self._history = list(state.history)
        self._mu = state.mu
        self._rng.bit_generator.state = copy.deepcopy(state.rng)
        self._drawn = state.drawn
        self._last_choice = None

    @property
    def mu(self) -> float:
        return self._mu

    def _trim(self) -> None:
        if self._keep is not None and len(self._history) > self._keep:
            del self._history[: len(self._history) - self._keep]

    # -- the chain -----------------------------------------------------------------------------------

    def chain(self, logits: np.ndarray, u: float) -> tuple[np.ndarray, np.ndarray, float]:
        """The candidates left after every sampler, and the uniform left for the pick (XTC takes its
        coin from u; see filters.xtc_coin). Order: logit bias, then settings.samplers in order; with
        Mirostat: logit bias, temperature, Mirostat."""
        s = self.settings
        z = np.asarray(logits)  # f32 [n_vocab] from the engine (kept as given: see filters' docstring)
        if z.dtype not in (np.float32, np.float64):
            z = z.astype(np.float64)
        ids, z = f.logit_bias(self._arange(len(z)), z, self._bias_tokens, self._bias_values)
        if s.mirostat:
            ids, z = f.temperature(ids, z, s.temperature)
            if s.mirostat == 1:
                return (*mirostat_v1(ids, z, self._mu, len(logits)), u)
            return (*mirostat_v2(ids, z, self._mu), u)
        for stage in s.samplers:
            if stage == "xtc":
                if s.xtc_probability > 0 and s.xtc_threshold <= 0.5 and len(ids) >= 2:
                    apply, u = f.xtc_coin(u, s.xtc_probability)
                    if apply:
                        ids, z = f.xtc(ids, z, s.xtc_threshold)
            else:
                ids, z = self._stage(stage, ids, z)
        return ids, z, u

    def _stage(self, stage: str, ids: np.ndarray, z: np.ndarray) -> f.Candidates:
        s = self.settings
        if stage == "penalties":
            return f.penalties(ids, z, self._window(self._penalty_n), s.repeat_penalty, s.frequency_penalty,
                               s.presence_penalty)
        if stage == "dry":
            if self._breakers is None:
                return ids, z
            return dry(ids, z, self._window(self._dry_n), self._breakers, s.dry_multiplier, s.dry_base,
                       s.dry_allowed_length)
        if stage == "top_n_sigma":
            return f.top_n_sigma(ids, z, s.top_n_sigma)
        if stage == "top_k":
            return f.top_k(ids, z, s.top_k)
        if stage == "typ_p":
            return f.typical(ids, z, s.typical_p)
        if stage == "top_p":
            return f.top_p(ids, z, s.top_p)
        if stage == "min_p":
            return f.min_p(ids, z, s.min_p)
        if stage == "temperature":
            return f.temperature(ids, z, s.temperature)
        raise ValueError(f"unknown sampler {stage!r}")

    def _window(self, n: int) -> np.ndarray:
        """The last n tokens of the history (-1: all of it)."""
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        tokens = self._history if n == -1 else self._history[-n:]
        return np.array(tokens, dtype=np.int64)

    def _arange(self, n: int) -> np.ndarray:
        if self._ids is None or len(self._ids) != n:
            self._ids = np.arange(n, dtype=np.int64)
            self._ids.flags.writeable = False
        return self._ids
