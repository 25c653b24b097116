"""ConstrainedSampler: a Sampler held to a grammar, over the byte vocabulary (one token per byte,
plus an end token), with random logits standing in for a model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kinetic.grammar import ConstrainedSampler, GrammarError, json_schema_grammar, parse_gbnf
from kinetic.runtime.sampling import Sampler, SamplingSettings
from tests.grammar.conftest import BYTE_EOS
from tests.grammar.helpers import validate

N_VOCAB = BYTE_EOS + 1
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}}, "required": ["a"]}


def _logits(rng: np.random.Generator) -> np.ndarray:
    logits = rng.normal(size=N_VOCAB).astype(np.float32) * 2  # f32 [n_vocab]
    logits[ord("}")] += 3  # so random decoding closes the object soon
    return logits


def _decode(picker: ConstrainedSampler, seed: int, limit: int = 400) -> list[int]:
    """Plain decoding on random logits until the grammar must stop or an end token."""
    rng = np.random.default_rng(seed)
    tokens = []
    for _ in range(limit):
        token = picker.sample(_logits(rng))
        tokens.append(token)
        if token == BYTE_EOS or picker.must_stop:
            break
    return tokens


def _picker(byte_matcher, grammar, **settings) -> ConstrainedSampler:
    sampler = Sampler(SamplingSettings(**settings), n_vocab=N_VOCAB)
    return ConstrainedSampler(sampler, byte_matcher(grammar).start())


@pytest.mark.parametrize("settings", [{"temperature": 0.0, "seed": 1}, {"temperature": 1.0, "seed": 2},
                                      {"temperature": 0.8, "top_k": 0, "top_p": 0.9, "min_p": 0.0, "seed": 3},
                                      {"temperature": 0.8, "repeat_penalty": 1.3, "seed": 4},
                                      {"temperature": 0.8, "mirostat": 2, "seed": 5}])
def test_answers_follow_the_schema_with_one_uniform_per_token(byte_matcher, settings):
    """Whatever the sampler settings, the text parses and validates, the grammar ends it, and every
    token drew exactly one uniform."""
    picker = _picker(byte_matcher, json_schema_grammar(SCHEMA), **settings)
    tokens = _decode(picker, seed=settings["seed"])
    assert picker.must_stop and tokens[-1] != BYTE_EOS
    assert validate(json.loads(bytes(tokens).decode()), SCHEMA) == []
    assert picker.sampler.drawn == len(tokens)


def test_same_seed_same_answer_and_logits_untouched(byte_matcher):
    """The same seed gives the same constrained answer; choose never writes to the row it is given."""
    grammar = json_schema_grammar(SCHEMA)
    a = _decode(_picker(byte_matcher, grammar, temperature=1.0, seed=9), seed=0)
    b = _decode(_picker(byte_matcher, grammar, temperature=1.0, seed=9), seed=0)
    assert a == b
    picker = _picker(byte_matcher, grammar, temperature=1.0, seed=9)
    row = _logits(np.random.default_rng(1))
    before = row.copy()
    assert picker.choose(row, 0.5) == ord("{")
    assert np.array_equal(row, before)


def test_choose_is_the_inner_choice_over_masked_logits(byte_matcher):
    """choose(logits, u) is the wrapped Sampler's choose over the logits with disallowed tokens at -inf."""
    picker = _picker(byte_matcher, 'root ::= "a" [bc]+ "d"', temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0)
    picker.accept(ord("a"))
    rng = np.random.default_rng(4)
    for u in (0.0, 0.3, 0.7, 0.999):
        logits = _logits(rng)
        masked = np.full_like(logits, -np.inf)
        masked[[ord("b"), ord("c")]] = logits[[ord("b"), ord("c")]]
        assert picker.choose(logits, u) == picker.sampler.choose(masked, u)


def test_snapshot_restore_rewinds_sampler_and_grammar(byte_matcher):
    """restore(snapshot()) puts back both the grammar state and the sampler's stream, so decoding
    from there repeats itself token for token."""
    picker = _picker(byte_matcher, json_schema_grammar(SCHEMA), temperature=1.0, seed=11)
    rng = np.random.default_rng(5)
    rows = [_logits(rng) for _ in range(6)]
    picker.sample(rows[0])
    snap = picker.snapshot()
    first = [picker.sample(r) for r in rows[1:]]
    picker.restore(snap)
    assert [picker.sample(r) for r in rows[1:]] == first


def test_disallowed_token_raises_and_moves_nothing(byte_matcher):
    """accept of a token the grammar rejects raises GrammarError and leaves grammar and sampler as they were."""
    picker = _picker(byte_matcher, 'root ::= "yes" | "no"', temperature=0.0, repeat_penalty=1.1, seed=0)
    snap = picker.snapshot()
    with pytest.raises(GrammarError):
        picker.accept(ord("x"))
    assert picker.snapshot()[1] == snap[1] and picker.snapshot()[0].history == snap[0].history
    for ch in b"no":
        assert not picker.must_stop
        picker.accept(ch)
    assert picker.is_complete and picker.must_stop


def test_a_grammar_no_token_can_follow_is_an_error():
    """A grammar whose text this vocabulary cannot write raises GrammarError instead of picking blindly."""
    from kinetic.grammar import GrammarMatcher, TokenVocab

    vocab = TokenVocab([b"a", b"b", b""], eog_ids=[2])
    picker = ConstrainedSampler(Sampler(SamplingSettings(temperature=0.0), n_vocab=3),
                                GrammarMatcher(parse_gbnf('root ::= "c"'), vocab).start())
    with pytest.raises(GrammarError, match="no token"):
        picker.choose(np.zeros(3, dtype=np.float32), 0.5)
