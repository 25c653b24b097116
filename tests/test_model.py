"""The Python API on the real SmolLM2 model: text in, the golden tokens out."""

from __future__ import annotations

import json

import pytest

import kinetic
from tests.conftest import load_golden


@pytest.fixture(scope="module")
def model(smollm2_path):
    return kinetic.Model(smollm2_path, n_ctx=256)


def test_name_and_tokenize(model):
    """tokenize gives llama.cpp's ids in both golden variants."""
    golden = load_golden("smollm2-135m")
    assert model.name == "SmolLM2-135M-Instruct.Q4_1"  # the file name without its extension (seed 001)
    case = golden["tokenize"][5]
    assert model.tokenize(case["text"], add_special=False, parse_special=False) == case["ids"]
    assert model.tokenize(case["text"], add_special=True, parse_special=True) == case["ids_add_special_parse_special"]


def test_chat_template_renders_the_golden_prompt(model):
    case = load_golden("smollm2-135m")["chat"][0]
    assert model.apply_chat_template(case["messages"], add_generation_prompt=True) == case["rendered"]


def test_greedy_generation_gives_llama_cpp_tokens(model):
    """Greedy tokens from the golden prompt equal llama.cpp's (this case has no near-tie early on)."""
    case = load_golden("smollm2-135m")["raw"][0]
    ids = model.generate(case["prompt_ids"], max_tokens=8, return_tokens=True)
    assert ids == case["ids"][:8]
    assert model.last_stats.generated_tokens == 8 and model.last_stats.stop_reason == "length"


def test_text_stream_equals_whole_text(model):
    """Streaming gives the same text, piece by piece, as the whole answer."""
    whole = model.generate("The capital of France is", max_tokens=6)
    pieces = list(model.generate("The capital of France is", max_tokens=6, stream=True))
    assert "".join(pieces) == whole
    assert whole.startswith(" Paris")


def test_seeded_sampling_repeats(model):
    """The same seed and temperature give the same tokens."""
    a = model.generate([504, 3575, 282], max_tokens=4, temperature=0.9, seed=7, return_tokens=True)
    b = model.generate([504, 3575, 282], max_tokens=4, temperature=0.9, seed=7, return_tokens=True)
    assert a == b


def test_sampling_settings_and_recorded_seed_replay(model):
    """A sampled answer without a seed records the seed it drew; that seed with the same settings replays it."""
    settings = model.sampling_defaults()
    a = model.generate([504, 3575, 282], max_tokens=6, sampling=settings, repeat_penalty=1.1, return_tokens=True)
    used = model.last_stats.sampling
    assert used.seed is not None and used.repeat_penalty == 1.1 and used.temperature == settings.temperature
    assert model.generate([504, 3575, 282], max_tokens=6, sampling=used, return_tokens=True) == a


def test_bad_sampling_settings_raise_kinetic_error(model):
    """Out-of-range or unknown sampling settings raise KineticError naming the setting."""
    with pytest.raises(kinetic.KineticError, match="repeat_penalty"):
        model.generate([504], max_tokens=1, repeat_penalty=0)
    with pytest.raises(kinetic.KineticError, match="top_kk"):
        model.generate([504], max_tokens=1, top_kk=3)


def test_bad_prompts_raise_kinetic_error(model):
    with pytest.raises(kinetic.KineticError, match="outside the vocabulary"):
        model.generate([999_999], max_tokens=1)
    with pytest.raises(kinetic.KineticError, match="empty"):
        model.generate([], max_tokens=1)


def test_unknown_model_raises_kinetic_error(tmp_path):
    with pytest.raises(kinetic.KineticError, match="no model file"):
        kinetic.Model(tmp_path / "nope.gguf")


def test_generate_with_a_grammar(model):
    """grammar= holds the answer: GBNF text gives one of its strings and stops there ("stop"); a JSON
    Schema grammar gives JSON that parses and validates; the same seed gives the same constrained answer."""
    from kinetic.grammar import json_schema_grammar

    answer = model.generate("Is Paris in France? Answer:", max_tokens=8, grammar='root ::= " yes" | " no"')
    assert answer in (" yes", " no") and model.last_stats.stop_reason == "stop"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    prompt = model.apply_chat_template([{"role": "user", "content": "Give me a JSON object with an integer a."}])
    text = model.generate(prompt, max_tokens=24, grammar=json_schema_grammar(schema))
    assert model.last_stats.stop_reason == "stop"
    assert isinstance(json.loads(text)["a"], int) and set(json.loads(text)) == {"a"}
    sampled = [model.generate(prompt, max_tokens=24, temperature=1.0, seed=3, grammar=json_schema_grammar(schema),
                              return_tokens=True) for _ in range(2)]
    assert sampled[0] == sampled[1]
    with pytest.raises(kinetic.KineticError, match="undefined rule"):
        model.generate("x", max_tokens=1, grammar="root ::= nope")


def test_drafting_never_changes_the_answer(model, monkeypatch):
    """RAD-1 on (the default) gives plain decoding's tokens: greedy, seeded sampling, and under a
    grammar whose end falls inside a drafted pass; the resent request drafts from the first one.
    Pass costs ignore the clock here, so whether guesses are taken does not depend on the load."""
    from kinetic.grammar import json_schema_grammar
    from tests.device_checks import FixedCosts

    monkeypatch.setattr(model.decoder(), "costs", FixedCosts())

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    prompt = model.apply_chat_template([{"role": "user", "content": "Repeat: 1 2 3 4 5 6 7 8 9 10"}])
    cases = [{}, {"temperature": 0.9, "seed": 11},
             {"temperature": 1.0, "seed": 3, "grammar": json_schema_grammar(schema)}]
    accepted = 0
    for kw in cases:
        plain = model.generate(prompt, max_tokens=24, return_tokens=True, draft=False, **kw)
        reason = model.last_stats.stop_reason
        for _ in range(2):
            assert model.generate(prompt, max_tokens=24, return_tokens=True, **kw) == plain
            assert model.last_stats.stop_reason == reason
            accepted += model.last_stats.accepted
    assert accepted > 0
