"""The sampler chain: its settings, the order of its stages, seeding and the Sampler's state (each
sampler alone: test_samplers.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from kinetic.runtime.sampling import Sampler, SamplingSettings, settings_from_metadata
from tests.runtime.sampling_cases import PLAIN, log

# -- settings ---------------------------------------------------------------------------------------

def test_defaults_are_llama_cpp_common_h():
    """The defaults are llama.cpp's common_params_sampling values and order."""
    s = SamplingSettings()
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.typical_p, s.top_n_sigma) == (0.8, 40, 0.95, 0.05, 1.0, -1.0)
    assert (s.repeat_penalty, s.repeat_last_n, s.presence_penalty, s.frequency_penalty) == (1.0, 64, 0.0, 0.0)
    assert (s.dry_multiplier, s.dry_base, s.dry_allowed_length, s.dry_penalty_last_n) == (0.0, 1.75, 2, 64)
    assert s.dry_sequence_breakers == ("\n", ":", '"', "*")
    assert (s.xtc_probability, s.xtc_threshold, s.mirostat, s.mirostat_tau, s.mirostat_eta) == (0, 0.1, 0, 5, 0.1)
    assert s.logit_bias == () and s.seed is None
    assert s.samplers == ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")


@pytest.mark.parametrize("change, message", [
    (dict(repeat_penalty=0.0), "repeat_penalty"), (dict(mirostat=3), "mirostat"), (dict(dry_base=0.5), "dry_base"),
    (dict(xtc_probability=1.5), "xtc_probability"), (dict(top_p=math.nan), "top_p"),
    (dict(repeat_last_n=-2), "repeat_last_n"), (dict(samplers=("top_k", "bogus")), "bogus"),
    (dict(logit_bias={3: math.inf}), "logit_bias"), (dict(logit_bias={-1: 1.0}), "negative"),
])
def test_invalid_settings_raise_naming_the_setting(change, message):
    """A value llama.cpp refuses raises ValueError naming the setting."""
    with pytest.raises(ValueError, match=message):
        SamplingSettings(**change)


def test_general_sampling_metadata_overrides_defaults():
    """general.sampling.* keys set their settings, parsed like strtol/strtof; a bad value keeps the default."""
    meta = {"general.sampling.temp": 0.6, "general.sampling.top_k": np.int32(20), "general.sampling.top_p": "0.9",
            "general.sampling.min_p": "oops", "general.sampling.penalty_repeat": 0.0,
            "general.sampling.penalty_last_n": "128", "general.sampling.mirostat": 2,
            "general.sampling.mirostat_tau": 4.5, "general.sampling.mirostat_eta": 0.2,
            "general.sampling.xtc_probability": 0.25, "general.sampling.xtc_threshold": 0.2,
            "general.sampling.sequence": "top_k;Temp;no-such-sampler;min-p", "general.name": "x"}
    s = settings_from_metadata(meta)
    assert (s.temperature, s.top_k, s.top_p, s.min_p) == (0.6, 20, 0.9, 0.05)
    assert (s.repeat_penalty, s.repeat_last_n) == (1.0, 128)
    assert (s.mirostat, s.mirostat_tau, s.mirostat_eta, s.xtc_probability, s.xtc_threshold) == (2, 4.5, 0.2, 0.25, 0.2)
    assert s.samplers == ("top_k", "temperature", "min_p")
    assert settings_from_metadata({}) == SamplingSettings()


# -- the chain ----------------------------------------------------------------------------------------

def test_temperature_runs_after_the_filters():
    """Temperature is last: min_p filters the untempered logits, so a high temperature cannot let 0.1 back in."""
    sampler = Sampler(SamplingSettings(top_k=0, top_p=1.0, min_p=0.4, temperature=100.0, seed=1))
    ids, z, _ = sampler.chain(log(0.6, 0.3, 0.1), 0.5)
    assert ids.tolist() == [0, 1] and z.tolist() == pytest.approx((log(0.6, 0.3) / 100).tolist())
    first = Sampler(SamplingSettings(top_k=0, top_p=1.0, min_p=0.4, temperature=100.0, seed=1,
                                     samplers=("temperature", "min_p")))
    assert first.chain(log(0.6, 0.3, 0.1), 0.5)[0].tolist() == [0, 1, 2]


def test_penalties_run_before_top_k():
    """Penalties come before top-k: a repeated token can fall out of the top k."""
    settings = SamplingSettings(**{**PLAIN, "top_k": 1}, repeat_penalty=4.0, seed=1)
    assert Sampler(settings, history=[0]).chain(np.array([2.0, 1.0, 0.0]), 0.5)[0].tolist() == [1]


def test_logit_bias_runs_first_and_greedy_follows_it():
    """Greedy is the argmax after logit bias and penalties, lowest id on ties."""
    assert Sampler(SamplingSettings(temperature=0, seed=1)).choose(np.array([1.0, 5.0, 5.0, 2.0]), 0.7) == 1
    biased = Sampler(SamplingSettings(temperature=0, seed=1, logit_bias={1: -1.0}))
    assert biased.choose(np.array([1.0, 5.0, 5.0, 2.0]), 0.7) == 2
    penalized = Sampler(SamplingSettings(temperature=0, repeat_penalty=2.0, seed=1), history=[1, 2])
    assert penalized.choose(np.array([3.0, 5.0, 5.0, 2.0]), 0.7) == 0


# -- seeding and state ------------------------------------------------------------------------------------

def _rows(n: int, vocab: int = 500, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, vocab)) * 2).astype(np.float32)


def _run(settings: SamplingSettings, rows: np.ndarray, history=(), pieces=None) -> list[int]:
    sampler = Sampler(settings, pieces, history=history)
    return [sampler.sample(row) for row in rows]


SETTINGS_MIX = [
    SamplingSettings(),
    SamplingSettings(top_k=0, top_p=0.9, repeat_penalty=1.3, presence_penalty=0.2, frequency_penalty=0.1),
    SamplingSettings(xtc_probability=0.5, xtc_threshold=0.05, typical_p=0.9, top_n_sigma=2.0),
    SamplingSettings(dry_multiplier=0.8, dry_allowed_length=1),
    SamplingSettings(mirostat=1),
    SamplingSettings(mirostat=2, mirostat_tau=3.0),
]
PIECES = [f"t{i}".encode() for i in range(499)] + [b"\n"]


@pytest.mark.parametrize("settings", SETTINGS_MIX, ids=range(len(SETTINGS_MIX)))
def test_same_seed_same_tokens_different_seeds_differ(settings):
    """The answer depends only on the seed and the settings: same seed, same tokens; other seeds, others."""
    rows = _rows(40)
    a = _run(replace_seed(settings, 7), rows, history=[1, 2, 3], pieces=PIECES)
    assert a == _run(replace_seed(settings, 7), rows, history=[1, 2, 3], pieces=PIECES)
    assert a != _run(replace_seed(settings, 8), rows, history=[1, 2, 3], pieces=PIECES)


def replace_seed(settings: SamplingSettings, seed: int) -> SamplingSettings:
    return replace(settings, seed=seed)


@pytest.mark.parametrize("settings", SETTINGS_MIX, ids=range(len(SETTINGS_MIX)))
def test_choose_then_accept_is_plain_sampling(settings):
    """u = next_uniform(); t = choose(logits, u); accept(t) gives exactly what sample() gives, and choose
    changes no state (asking twice, or about a row never kept, leaves the answer unchanged)."""
    rows, other = _rows(30), _rows(30, seed=1)
    settings = replace_seed(settings, 3)
    sampler = Sampler(settings, PIECES, history=[5, 6])
    out = []
    for row, decoy in zip(rows, other, strict=True):
        u = sampler.next_uniform()
        before = sampler.snapshot()
        sampler.choose(decoy, u)  # a verifier asking about another row
        token = sampler.choose(row, u)
        assert sampler.snapshot() == before
        sampler.accept(token)
        out.append(token)
    assert out == _run(settings, rows, history=[5, 6], pieces=PIECES)


@pytest.mark.parametrize("settings", SETTINGS_MIX, ids=range(len(SETTINGS_MIX)))
def test_snapshot_restore_replays_the_same_tokens(settings):
    """After restore(snapshot()), the sampler gives the same tokens it gave after the snapshot."""
    rows = _rows(30)
    sampler = Sampler(replace_seed(settings, 11), PIECES, history=[1, 1, 2])
    for row in rows[:10]:
        sampler.sample(row)
    state = sampler.snapshot()
    first = [sampler.sample(row) for row in rows[10:]]
    sampler.restore(state)
    assert [sampler.sample(row) for row in rows[10:]] == first


def test_every_token_consumes_one_uniform():
    """Greedy or sampled, each token uses exactly one uniform: the i-th token gets the i-th u of PCG64(seed)."""
    rows = _rows(5)
    for temperature in (0.0, 0.8):
        sampler = Sampler(SamplingSettings(temperature=temperature, seed=5))
        stream = np.random.Generator(np.random.PCG64(5))
        for row in rows:
            u = stream.random()
            assert sampler.choose(row, u) == sampler.sample(row)
        assert sampler.drawn == len(rows)


def test_greedy_is_the_lowest_id_argmax():
    """temperature <= 0 gives the argmax, the lowest id on ties, whatever u."""
    sampler = Sampler(SamplingSettings(temperature=0, seed=1))
    assert {sampler.choose(np.array([0.0, 2.0, 2.0, 1.0], np.float32), u) for u in (0.0, 0.5, 0.999)} == {1}


def test_sampling_follows_the_distribution():
    """Over many uniforms, sampled tokens have the chain's probabilities (.5 .3 .2 at temperature 1)."""
    sampler = Sampler(SamplingSettings(**PLAIN, seed=2))
    counts = np.bincount([sampler.sample(log(0.5, 0.3, 0.2)) for _ in range(20_000)], minlength=3) / 20_000
    assert counts.tolist() == pytest.approx([0.5, 0.3, 0.2], abs=0.015)


def test_fresh_seed_is_recorded_and_replays():
    """Without a seed the Sampler draws one and records it; that seed gives the same tokens again."""
    rows = _rows(20)
    sampler = Sampler(SamplingSettings())
    tokens = [sampler.sample(row) for row in rows]
    assert sampler.settings.seed is not None
    assert _run(SamplingSettings(seed=sampler.seed), rows) == tokens


def test_mirostat_accept_needs_the_row():
    """With Mirostat, accept() of a token no choose() returned must be given the row's logits."""
    sampler = Sampler(SamplingSettings(mirostat=2, seed=1))
    with pytest.raises(ValueError, match="Mirostat"):
        sampler.accept(3)
    sampler.accept(3, logits=np.zeros(5))
    assert sampler.mu != 10.0


def test_dry_needs_vocab_pieces_and_bias_ids_fit_the_vocabulary():
    """DRY without token pieces, or a logit bias outside the vocabulary, is refused when the Sampler is built."""
    with pytest.raises(ValueError, match="pieces"):
        Sampler(SamplingSettings(dry_multiplier=0.8))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        Sampler(SamplingSettings(logit_bias={10: 1.0}), n_vocab=10)
