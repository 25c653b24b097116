"""kinetic chat's conversation (kinetic/cli/chat_session.py): each turn reuses the conversation's cache
and still answers exactly what a fresh run of the same prompt answers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kinetic.cli.chat_session import CONTENT, REASONING, ChatSession
from kinetic.model import Model


@pytest.fixture(scope="module")
def model(smollm2_path):
    return Model(smollm2_path, n_ctx=1024, threads=2)


def fresh_tokens(model: Model, turn) -> list[int]:
    """The answer a new sequence gives for the turn's prompt, with the settings the turn used (its end
    of turn token included, as the turn records it)."""
    model.generate(turn.prompt_ids, max_tokens=24, sampling=turn.finished.settings)
    return model.last_stats.tokens


def ask(session: ChatSession, text: str) -> str:
    return "".join(t for kind, t in session.answer(text) if kind == CONTENT)


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.9, "seed": 7}],
                         ids=["greedy", "seeded"])
def test_turns_reuse_the_cache_and_equal_a_fresh_run(model, sampling):
    """The second turn feeds only what the first left out of the cache, and every turn's tokens are
    the tokens a fresh sequence gives for its whole prompt (greedy and seeded sampling)."""
    session = ChatSession(model, replace(model.sampling_defaults(), **sampling), max_tokens=24)
    ask(session, "Say hello.")
    first = session.last
    assert first.reused == 0 and first.finished.tokens == fresh_tokens(model, first)
    ask(session, "Now say goodbye.")
    second = session.last
    assert second.prompt_ids[:len(first.prompt_ids)] == first.prompt_ids
    assert second.reused > len(first.prompt_ids)  # the first answer's tokens too
    assert second.finished.tokens == fresh_tokens(model, second)
    assert session.cached == len(second.prompt_ids) + len(second.finished.tokens) - 1  # continued, not redone


def test_a_conversation_that_changes_keeps_only_the_shared_start(model):
    """After /system (a new conversation whose prompt differs early), the turn keeps only the tokens
    the new prompt shares with the cache, and answers as a fresh run does."""
    session = ChatSession(model, replace(model.sampling_defaults(), temperature=0.0), max_tokens=24)
    ask(session, "Say hello.")
    ask(session, "Again.")
    session.set_system("You answer in one word.")
    ask(session, "Name a colour.")
    turn = session.last
    assert 0 < turn.reused < 10  # the template's opening only
    assert turn.finished.tokens == fresh_tokens(model, turn)
    assert session.messages[0] == {"role": "user", "content": "Name a colour."}


def test_a_full_context_is_said_with_what_to_do(model):
    """A conversation longer than the context is refused with a line pointing at /clear."""
    from kinetic.errors import KineticError

    session = ChatSession(model, model.sampling_defaults(), max_tokens=4)
    with pytest.raises(KineticError, match="context holds 1024") as err:
        ask(session, "word " * 1200)
    assert "/clear" in err.value.hint


THINKING_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking -%}{{- '<think>\\n' -}}"
    "{%- else -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}{%- endif -%}"
)


def test_reasoning_follows_think_on_a_template_that_thinks(smollm2_path, tmp_path):
    """On a template with <think> blocks, reasoning off renders a closed block (the answer is content)
    and /think on leaves it open, so the answer streams as reasoning; a template without one has
    no reasoning to switch (thinks is False)."""
    template = tmp_path / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    model = Model(smollm2_path, n_ctx=512, threads=2, chat_template_file=template)
    session = ChatSession(model, replace(model.sampling_defaults(), temperature=0.0), max_tokens=6)
    assert session.thinks and session.reasoning == "off"
    kinds = {kind for kind, _ in session.answer("Say hello.")}
    assert kinds == {CONTENT}
    assert session.toggle_reasoning() == "on"
    kinds = {kind for kind, _ in session.answer("Say hello again.")}
    assert kinds == {REASONING}
    plain = ChatSession(Model(smollm2_path, n_ctx=512, threads=2), model.sampling_defaults())
    assert not plain.thinks
