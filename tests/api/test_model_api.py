"""kinetic.Model as seed 001 ("Python") documents it: chat through the template, name, load errors as
RuntimeError, off=[...] as the command line's --off."""

from __future__ import annotations

import pytest

import kinetic


@pytest.fixture(scope="module")
def model(smollm2_path) -> kinetic.Model:
    return kinetic.Model(smollm2_path, n_ctx=256, warm_start=False)


MESSAGES = [{"role": "user", "content": "Name three rivers."}]


def test_chat_answers_through_the_models_template(model):
    """chat(messages) is generate() of the rendered template: the same greedy text, streamed or not."""
    prompt = model.apply_chat_template(MESSAGES, add_generation_prompt=True)
    want = model.generate(prompt, max_tokens=12, temperature=0)
    assert model.chat(MESSAGES, max_tokens=12, temperature=0) == want
    assert "".join(model.chat(MESSAGES, max_tokens=12, temperature=0, stream=True)) == want
    assert model.last_stats.prompt_tokens == len(model.tokenize(prompt, parse_special=True))


def test_chat_with_a_seed_repeats(model):
    """The same seed gives the same sampled chat answer."""
    answers = {model.chat(MESSAGES, max_tokens=12, temperature=0.9, seed=7) for _ in range(2)}
    assert len(answers) == 1


def test_name_is_the_file_name_without_its_extension(model, smollm2_path):
    """model.name is the file's stem, not the file's general.name."""
    assert model.name == smollm2_path.stem == "SmolLM2-135M-Instruct.Q4_1"


def test_a_load_error_is_a_runtime_error(tmp_path):
    """A file that cannot be loaded raises an exception that is a RuntimeError (a KineticError)."""
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    for path in (bad, tmp_path / "missing.gguf"):
        with pytest.raises(RuntimeError) as caught:
            kinetic.Model(path)
        assert isinstance(caught.value, kinetic.KineticError)


def test_off_takes_the_command_lines_list(smollm2_path):
    """off=["rad1", "shortlist", "warm-start"] (or the comma-separated text) turns each off as --off
    does; an unknown name is refused listing the known ones; draft=False still means off=["rad1"]."""
    m = kinetic.Model(smollm2_path, n_ctx=64, off=["rad1", "warm-start"])
    assert m.draft is False and m.warm is None
    assert kinetic.Model(smollm2_path, n_ctx=64, off="shortlist").engine.head is None
    assert kinetic.Model(smollm2_path, n_ctx=64, draft=False).draft is False
    with pytest.raises(kinetic.KineticError, match="unknown speed technology 'turbo'"):
        kinetic.Model(smollm2_path, n_ctx=64, off=["turbo"])
