"""The sampler chain: each sampler against hand-computed cases, the order, seeding and the Sampler's state."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from kinetic.runtime.sampling import Sampler, SamplingSettings, settings_from_metadata, top_logprobs
from kinetic.runtime.sampling import filters as f
from kinetic.runtime.sampling.dry import BreakerIndex, dry, repeat_lengths
from kinetic.runtime.sampling.mirostat import mirostat_v1, mirostat_v2

# Every filter off, temperature 1: the chain returns the logits as the earlier stages leave them.
PLAIN = dict(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0)


def ids_of(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64)


def log(*probs: float) -> np.ndarray:
    return np.log(np.array(probs, dtype=np.float64))


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


# -- each sampler -----------------------------------------------------------------------------------

def test_logit_bias_adds_and_bans():
    """logit_bias adds each pair's bias (a token listed twice gets both); -inf bans the token."""
    ids, z = f.logit_bias(ids_of(3), np.array([1.0, 2.0, 3.0]), np.array([0, 2, 0]), np.array([1.0, -np.inf, 0.5]))
    assert z.tolist() == [2.5, 2.0, -np.inf]


def test_penalties_formula_and_sign_rule():
    """Seen tokens: positive logits divide by repeat, others multiply; then -= count*freq + presence."""
    logits = np.array([2.0, -1.0, 0.5, 3.0, 0.0])
    _, z = f.penalties(ids_of(5), logits, np.array([0, 1, 1, 4]), repeat=2.0, frequency=0.5, presence=0.25)
    assert z.tolist() == [2 / 2 - 0.75, -1 * 2 - 1.25, 0.5, 3.0, 0 - 0.75]
    assert logits.tolist() == [2.0, -1.0, 0.5, 3.0, 0.0]  # pure


def test_penalties_see_only_the_last_repeat_last_n_tokens():
    """Only the last repeat_last_n tokens of the history are penalized; -1 means all of them."""
    logits = np.array([1.0, 1.0, 1.0])
    last2 = Sampler(SamplingSettings(**PLAIN, repeat_penalty=2.0, repeat_last_n=2, seed=1), history=[0, 1, 2])
    assert last2.chain(logits, 0.5)[1].tolist() == [1.0, 0.5, 0.5]
    everything = Sampler(SamplingSettings(**PLAIN, repeat_penalty=2.0, repeat_last_n=-1, seed=1), history=[0, 1, 2])
    assert everything.chain(logits, 0.5)[1].tolist() == [0.5, 0.5, 0.5]


def test_dry_repeat_lengths_match_llama_cpp_example():
    """llama.cpp's worked example: last tokens a b c c b c y a b c give repeat counts 0 0 3 1 0 2 0 0 0."""
    a, b, c, y = 1, 2, 3, 4
    window = np.array([a, b, c, c, b, c, y, a, b, c])
    assert repeat_lengths(window, limit=len(window)).tolist() == [0, 0, 3, 1, 0, 2, 0, 0, 0]


def test_dry_penalizes_the_token_that_extends_a_repeat():
    """In 0 1 2 0 1 2 0 1, emitting 2 would extend a 5-token repeat: penalty multiplier * base^(5 - allowed)."""
    index = BreakerIndex.build([b"a", b"b", b"c", b"d"], [])
    window = np.array([0, 1, 2, 0, 1, 2, 0, 1])
    _, z = dry(ids_of(4), np.zeros(4), window, index, multiplier=1.0, base=2.0, allowed_length=2)
    assert z.tolist() == [0.0, 0.0, -(2.0 ** 3), 0.0]
    _, short = dry(ids_of(4), np.zeros(4), window[-5:], index, multiplier=1.0, base=2.0, allowed_length=2)
    assert short.tolist() == [0.0, 0.0, -1.0, 0.0]  # window 1 2 0 1 ... : repeat of 2 -> 2^0


def test_dry_breaker_index_matches_token_text():
    """A token holding a whole breaker is one by itself; one ending with a breaker's start needs the rest after it."""
    index = BreakerIndex.build([b"a", b"b", b"c", b"x:", b"xa", b"b"], [":", "ab"])
    assert index.heads == {3: (b"",), 0: (b"b",), 4: (b"b",)}


def test_dry_sequence_breaker_caps_the_repeat():
    """A breaker spelled over two tokens (xa, b for "ab") stops a repeat from reaching back past it."""
    pieces = [b"p", b"q", b"xa", b"b"]
    window = np.array([0, 1, 2, 3, 0, 1, 2, 3, 0, 1])
    plain = BreakerIndex.build(pieces, [])
    _, z = dry(ids_of(4), np.zeros(4), window, plain, multiplier=1.0, base=2.0, allowed_length=2)
    assert z.tolist() == [0.0, 0.0, -(2.0 ** 4), 0.0]  # 6 tokens repeat before token 2
    broken = BreakerIndex.build(pieces, ["ab"])
    _, z = dry(ids_of(4), np.zeros(4), window, broken, multiplier=1.0, base=2.0, allowed_length=2)
    assert z.tolist() == [0.0, 0.0, -1.0, 0.0]  # capped at the 2 tokens after the last "ab"


def test_dry_never_penalizes_a_whole_breaker_token():
    """A token that contains a breaker gets no DRY penalty, however long the repeat it extends."""
    index = BreakerIndex.build([b"a", b"b", b"\n"], ["\n"])
    window = np.array([0, 1, 0, 1, 0, 1, 0, 1])
    _, z = dry(ids_of(3), np.zeros(3), window, index, multiplier=1.0, base=2.0, allowed_length=2)
    assert z[2] == 0.0 and z[0] < 0


def test_top_n_sigma_keeps_within_n_std_of_the_max():
    """Logits 0..4 have std sqrt(2): n=1 keeps logits >= 4 - 1.414, i.e. 3 and 4."""
    ids, _ = f.top_n_sigma(ids_of(5), np.arange(5.0), 1.0)
    assert ids.tolist() == [3, 4]


def test_top_k_keeps_the_k_best_lowest_id_on_ties():
    """top_k keeps the k highest logits, and among equal logits the lowest ids."""
    assert f.top_k(ids_of(4), np.array([1.0, 3.0, 3.0, 2.0]), 2)[0].tolist() == [1, 2]
    assert f.top_k(ids_of(4), np.array([3.0, 1.0, 3.0, 3.0]), 2)[0].tolist() == [0, 2]
    assert f.top_k(ids_of(4), np.array([3.0, 1.0, 3.0, 3.0]), 0)[0].tolist() == [0, 1, 2, 3]


def test_top_k_prefilter_agrees_with_a_full_sort():
    """On large vocabularies with many ties, the prefiltered top-k equals a full (logit desc, id asc) sort."""
    rng = np.random.default_rng(0)
    for n, k in [(50_000, 40), (262_144, 1), (262_144, 200), (5_000, 40)]:
        logits = np.round(rng.standard_normal(n) * 2, 1).astype(np.float32)
        expect = np.sort(np.lexsort((np.arange(n), -logits))[:k])
        assert f.top_k(ids_of(n), logits, k)[0].tolist() == expect.tolist()


def _full_sort_reference(logits: np.ndarray, u: float, p: float) -> tuple[int, list[int]]:
    """The pick and top-p by a full sort in canonical order (descending logit, ascending id)."""
    order = np.lexsort((np.arange(len(logits)), -logits))
    z = logits.astype(np.float64)
    weights = np.exp(z - z.max())
    running = np.cumsum(weights[order])
    picked = int(order[min(np.searchsorted(running, u * weights.sum(), side="right"), len(order) - 1)])
    probs = np.cumsum((weights / weights.sum())[order])
    return picked, sorted(order[: int(np.searchsorted(probs, p, side="left")) + 1].tolist())


def test_pick_and_top_p_on_a_large_vocabulary_equal_a_full_sort():
    """The pick and top-p look only at the best tokens first; the answer equals a full sort's."""
    rng = np.random.default_rng(1)
    for scale in (0.5, 3.0):  # flat (the head must widen) and peaked
        logits = np.round(rng.standard_normal(100_000) * scale, 2).astype(np.float32)
        for u, p in [(0.0, 0.1), (0.3, 0.5), (0.97, 0.95), (0.999999, 0.999)]:
            picked, nucleus = _full_sort_reference(logits, u, p)
            assert f.pick(ids_of(len(logits)), logits, u) == picked
            assert f.top_p(ids_of(len(logits)), logits, p)[0].tolist() == nucleus


def test_typical_keeps_the_most_typical_tokens():
    """Probs .5 .3 .2 (entropy 1.03 nats): token 1 is the most typical, then 0; p=.5 keeps {0, 1}, p=.2 {1}."""
    assert f.typical(ids_of(3), log(0.5, 0.3, 0.2), 0.5)[0].tolist() == [0, 1]
    assert f.typical(ids_of(3), log(0.5, 0.3, 0.2), 0.2)[0].tolist() == [1]
    assert f.typical(ids_of(3), log(0.5, 0.3, 0.2), 1.0)[0].tolist() == [0, 1, 2]


def test_top_p_keeps_the_shortest_prefix_reaching_p():
    """Probs .2 .5 .3 (by id): p=.4 keeps the best, p=.79 the best two, p=.81 all three."""
    logits = log(0.2, 0.5, 0.3)
    assert f.top_p(ids_of(3), logits, 0.4)[0].tolist() == [1]
    assert f.top_p(ids_of(3), logits, 0.79)[0].tolist() == [1, 2]
    assert f.top_p(ids_of(3), logits, 0.81)[0].tolist() == [0, 1, 2]


def test_min_p_keeps_tokens_p_times_as_likely_as_the_best():
    """Probs .5 .3 .2: min_p .5 keeps p >= .25 (tokens 0, 1); .39 keeps p >= .195 (all)."""
    assert f.min_p(ids_of(3), log(0.5, 0.3, 0.2), 0.5)[0].tolist() == [0, 1]
    assert f.min_p(ids_of(3), log(0.5, 0.3, 0.2), 0.39)[0].tolist() == [0, 1, 2]


def test_xtc_drops_all_top_choices_but_the_least_likely():
    """Probs .5 .3 .15 .05, threshold .2: .5 and .3 qualify, so .5 goes; threshold .4: only one, nothing goes."""
    logits = log(0.5, 0.3, 0.15, 0.05)
    assert f.xtc(ids_of(4), logits, 0.2)[0].tolist() == [1, 2, 3]
    assert f.xtc(ids_of(4), logits, 0.4)[0].tolist() == [0, 1, 2, 3]


def test_xtc_coin_splits_the_one_uniform():
    """XTC applies when u < probability, and the pick gets the rest of u rescaled to [0, 1)."""
    assert f.xtc_coin(0.25, 0.5) == (True, 0.5)
    assert f.xtc_coin(0.75, 0.5) == (False, 0.5)
    assert f.xtc_coin(0.75, 1.0) == (True, 0.75)


def test_xtc_in_the_chain_uses_the_tokens_uniform():
    """Probs .5 .3 .15 .05, XTC .5/.2: u=.1 applies XTC and picks at .2 of {.6 .3 .1} (token 1); u=.6 picks token 0."""
    sampler = Sampler(SamplingSettings(**PLAIN, xtc_probability=0.5, xtc_threshold=0.2, seed=1))
    logits = log(0.5, 0.3, 0.15, 0.05)
    assert sampler.choose(logits, 0.1) == 1
    assert sampler.choose(logits, 0.6) == 0


def test_temperature_scales_and_zero_is_argmax():
    """Temperature divides logits; <= 0 keeps only the likeliest token, the lowest id on ties."""
    assert f.temperature(ids_of(2), np.array([1.0, 2.0]), 2.0)[1].tolist() == [0.5, 1.0]
    assert f.temperature(ids_of(3), np.array([3.0, 1.0, 3.0]), 0.0)[0].tolist() == [0]


def test_pick_inverts_the_cdf_in_canonical_order():
    """Probs .2 .5 .3 (by id) in descending order 1, 2, 0: u=.1 -> 1, u=.6 -> 2, u=.9 -> 0."""
    logits = log(0.2, 0.5, 0.3)
    assert [f.pick(ids_of(3), logits, u) for u in (0.0, 0.1, 0.49, 0.51, 0.79, 0.81, 0.999)] == [1, 1, 1, 2, 2, 0, 0]


def test_mirostat_v2_truncates_by_mu_and_updates_it():
    """Probs .5 .25 .125 .125, mu 2 keeps surprise <= 2 bits ({0, 1}); picking 1 moves mu by eta*(log2 3 - tau)."""
    logits = log(0.5, 0.25, 0.125, 0.125)
    assert mirostat_v2(ids_of(4), logits, 2.0)[0].tolist() == [0, 1]
    sampler = Sampler(SamplingSettings(temperature=1.0, mirostat=2, mirostat_tau=1.0, mirostat_eta=0.1, seed=1))
    assert sampler.mu == 2.0
    token = sampler.choose(logits, 0.9)
    sampler.accept(token)
    assert token == 1 and sampler.mu == pytest.approx(2.0 - 0.1 * (math.log2(3) - 1.0))


def test_mirostat_v1_keeps_k_from_the_zipf_estimate():
    """Exact Zipf probs (s=2) over 1000 tokens, mu 10: k = (1 * 2^10 / (1 - 1/1000))^(1/2) = 32.02 -> 32 kept."""
    logits = -2.0 * np.log(np.arange(1, 1001, dtype=np.float64))
    assert len(mirostat_v1(ids_of(1000), logits, 10.0, 1000)[0]) == 32


def test_top_logprobs_are_the_raw_log_softmax():
    """top_logprobs gives the n likeliest tokens of the raw logits with their log-probabilities."""
    out = top_logprobs(log(0.2, 0.5, 0.3), 2)
    assert [t for t, _ in out] == [1, 2]
    assert [lp for _, lp in out] == pytest.approx([math.log(0.5), math.log(0.3)])


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
