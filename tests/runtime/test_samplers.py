"""Each sampler of the chain against hand-computed cases (llama.cpp's formulas and tie rules)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kinetic.runtime.sampling import Sampler, SamplingSettings, top_logprobs
from kinetic.runtime.sampling import filters as f
from kinetic.runtime.sampling.dry import BreakerIndex, dry, repeat_lengths
from kinetic.runtime.sampling.mirostat import mirostat_v1, mirostat_v2
from tests.runtime.sampling_cases import PLAIN, ids_of, log

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
