"""Zero Wait in kinetic chat (ChatSession.run_ahead): the conversation runs ahead while a message is
typed, never past the last word, gives way to the answer, and never changes it."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from kinetic.cli.chat_session import CONTENT, ChatSession
from kinetic.model import Model
from kinetic.runtime.generation import GenerationRequest, Generator
from kinetic.runtime.warm import grid_floor
from kinetic.server.prefill_api import prefix_before_last_word
from tests.runtime.convoy_helpers import alone

BATCH = 16  # a small grid, so a typed sentence crosses several grid points
SYSTEM = "You are a harbour master. You answer questions about tides, boats and moorings in short sentences."
MESSAGE = "Tell me when the tide is high tomorrow and where I can moor a small sailing boat for a week"


@pytest.fixture(scope="module")
def model(smollm2_path):
    model = Model(smollm2_path, n_ctx=1024, threads=2, batch=BATCH)
    model.engine.prompt_pass = BATCH  # one grid chunk a pass: a run ahead has several passes to stop between
    return model


def cold_tokens(model: Model, turn, max_tokens: int) -> tuple[int, ...]:
    """The turn's prompt run cold: a new sequence, no Warm Start, no drafting."""
    cold = Generator(model.engine, model.tokenizer, draft=False, warm=None)
    request = GenerationRequest(tuple(turn.prompt_ids), turn.finished.settings, max_tokens)
    return alone(cold, request).tokens


def ask(session: ChatSession, text: str) -> str:
    return "".join(t for kind, t in session.answer(text) if kind == CONTENT)


def typed_prefix_ids(model: Model, session: ChatSession, text: str) -> list[int]:
    """The prompt tokens before the message's last word, as the conversation renders them."""
    messages = session._with_system() + [{"role": "user", "content": text}]
    rendered = model.apply_chat_template(messages, add_generation_prompt=True)
    return model.tokenize(prefix_before_last_word(rendered, text), add_special=True, parse_special=True)


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.9, "seed": 11}],
                         ids=["greedy", "seeded"])
def test_typing_runs_ahead_and_the_answer_is_the_cold_one(model, sampling, monkeypatch):
    """Drafts sent as the message is typed (a word corrected on the way) run the conversation up to
    before the last word (one token less) in whole batches; after Enter the turn reuses all of it
    (cached covers the typed prefix) and its tokens are the cold run's."""
    generate, ahead_prompts = model.generator.generate, []

    def recorded(request, *args, **kwargs):
        if request.prefill_only:
            ahead_prompts.append(request.prompt)
        return generate(request, *args, **kwargs)

    monkeypatch.setattr(model.generator, "generate", recorded)
    session = ChatSession(model, replace(model.sampling_defaults(), **sampling), max_tokens=12, system=SYSTEM)
    ask(session, "Hello.")
    before = session.cached
    ready = before
    drafts = [MESSAGE[:n] for n in range(1, len(MESSAGE) + 1, 7)]
    drafts[3:3] = ["Tell me whan the", "Tell me wh"]  # a typo, then backspaced
    for draft in drafts + [MESSAGE]:
        ready = session.run_ahead(draft)
    prefix = typed_prefix_ids(model, session, MESSAGE)
    assert ahead_prompts[-1] == tuple(prefix[:-1])  # never the last word
    assert before < grid_floor(len(prefix) - 1, BATCH) <= ready <= len(prefix) - 1
    ask(session, MESSAGE)
    turn = session.last
    assert turn.reused >= ready
    assert tuple(turn.finished.tokens) == cold_tokens(model, turn, 12)


def test_an_answer_stops_a_run_ahead_after_its_pass(model, monkeypatch):
    """An answer asked while a run ahead is in flight waits for at most the pass it is in (the run
    ahead stops there), then answers as a cold run does."""
    session = ChatSession(model, replace(model.sampling_defaults(), temperature=0.0), max_tokens=8, system=SYSTEM)
    engine_run = model.engine.run
    ahead_passes, asked = [], threading.Event()

    def slow(parts):
        if threading.current_thread() is ahead:
            ahead_passes.append(asked.is_set())
        time.sleep(0.2)
        engine_run(parts)

    monkeypatch.setattr(model.engine, "run", slow)
    ahead = threading.Thread(target=session.run_ahead, args=(" ".join([SYSTEM, SYSTEM, MESSAGE]),))
    ahead.start()
    while not ahead_passes:
        time.sleep(0.01)
    asked.set()
    ask(session, MESSAGE)
    ahead.join(timeout=1)
    assert not ahead.is_alive()
    assert sum(ahead_passes) <= 1 and len(ahead_passes) < 6  # the draft had 9 batches to run
    monkeypatch.setattr(model.engine, "run", engine_run)
    assert tuple(session.last.finished.tokens) == cold_tokens(model, session.last, 8)


def test_nothing_runs_ahead_with_warm_start_off(smollm2_path):
    """With --off warm-start nothing would be reused, so a draft runs nothing."""
    model = Model(smollm2_path, n_ctx=512, threads=2, batch=BATCH, warm_start=False)
    session = ChatSession(model, model.sampling_defaults(), max_tokens=4, system=SYSTEM)
    passes = model.engine.passes
    assert session.run_ahead(MESSAGE) == 0
    assert model.engine.passes == passes
