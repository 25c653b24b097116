"""Warm Start, the exactness gate: a prompt started from a stored state (or a held sequence) gives bit
for bit the tokens a cold run gives, on both real models (5-turn conversations, greedy and seeded,
drafting on, after a restart from the disk tier, with corrupted state files) and every synthetic
file; prompts are cut on the same grid warm or cold; the memory tier keeps its bound."""

from __future__ import annotations

import numpy as np
import pytest

import kinetic
from kinetic.frontend.blocks import Options
from kinetic.runtime.generation import GenerationRequest, Generator
from kinetic.runtime.sampling import SamplingSettings
from kinetic.runtime.warm import WarmStore, common_prefix, grid_floor
from tests.conftest import NUMERICS_SYNTHETIC, OTHER_NUMERICS, model_path
from tests.runtime.convoy_helpers import alone
from tests.synthetic import synthetic_files, synthetic_path

GREEDY = SamplingSettings(temperature=0.0, seed=1)
SYSTEM = ("You are a patient assistant for a harbour office. You answer questions about tides, boats, "
          "moorings, fees and the weather in short plain sentences, and you never invent facts. ") * 5
QUESTIONS = ["When is high tide today?", "How much is a mooring for a week?", "Can I leave my boat in winter?",
             "Where do I pay the fees?", "Is there fresh water on the pier?"]


def _seeded(seed: int) -> SamplingSettings:
    return SamplingSettings(temperature=0.8, top_k=40, seed=seed)


def _cold(model) -> Generator:
    """A generator on the same engine without Warm Start or drafting: every prompt from its first token."""
    return Generator(model.engine, model.tokenizer, draft=False, warm=None)


def _conversation(model, cold: Generator, settings, turns: int = 5, max_tokens: int = 8) -> list[int]:
    """Runs a conversation through Model.generate (warm, drafting on) and checks each turn against
    the cold generator; returns each turn's cached prompt tokens."""
    messages = [{"role": "system", "content": SYSTEM}]
    cached = []
    for turn in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[turn]})
        ids = model.tokenize(model.apply_chat_template(messages), parse_special=True)
        turn_settings = settings(turn)
        model.generate(ids, max_tokens=max_tokens, sampling=turn_settings, draft=True)
        warm = model.last_stats.tokens  # an end-of-turn token included
        cached.append(model.last_stats.cached_tokens)
        cold_answer = alone(cold, GenerationRequest(tuple(ids), turn_settings, max_tokens))
        assert tuple(warm) == cold_answer.tokens, f"turn {turn + 1}: warm {warm} != cold {cold_answer.tokens}"
        answer = warm[:-1] if warm and warm[-1] in model.tokenizer.eot_ids else warm
        messages.append({"role": "assistant", "content": model.detokenize(answer)})
    return cached


@pytest.fixture(scope="module")
def smollm2():
    return kinetic.Model(model_path("smollm2-135m"), n_ctx=1024, threads=2)


@pytest.fixture(scope="module")
def gemma():
    return kinetic.Model(model_path("gemma3-270m"), n_ctx=1024, threads=2)


@pytest.mark.parametrize("name", ["smollm2", "gemma"])
def test_five_turn_conversation_warm_equals_cold(name, request):
    """Each turn of a 5-turn conversation run warm (the Model's held sequence and stored states,
    drafting on) gives bit for bit the tokens of the same prompt run cold, greedy and seeded; every
    turn after the first reuses prompt tokens."""
    model = request.getfixturevalue(name)
    cold = _cold(model)
    for settings in (lambda turn: GREEDY, lambda turn: _seeded(100 + turn)):
        cached = _conversation(model, cold, settings)
        assert all(c > 0 for c in cached[1:]), cached


def test_restart_restores_from_the_disk_tier_and_ignores_corrupted_files(smollm2, tmp_path):
    """A new Model on the same cache directory starts a prompt from the state an earlier one wrote
    (cached_tokens > 0, on the grid) and gives the cold tokens; after every state file is truncated
    or corrupted, the files are ignored (nothing restored) and the tokens are still the cold ones."""
    path = model_path("smollm2-135m")
    first = kinetic.Model(path, n_ctx=1024, threads=2, cache_dir=tmp_path)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
    answer = first.generate(first.apply_chat_template(messages), max_tokens=8)
    first.warm.disk.flush()
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": QUESTIONS[1]}]
    ids = first.tokenize(first.apply_chat_template(messages), parse_special=True)
    cold = alone(_cold(smollm2), GenerationRequest(tuple(ids), GREEDY, 8)).tokens

    second = kinetic.Model(path, n_ctx=1024, threads=2, cache_dir=tmp_path)
    assert tuple(second.generate(ids, max_tokens=8, return_tokens=True)) == cold
    restored = second.last_stats.cached_tokens
    assert restored > 0 and restored % second.engine.batch == 0
    second.warm.disk.flush()

    files = sorted(tmp_path.glob("*.kwarm"))
    assert files
    for i, file in enumerate(files):
        data = bytearray(file.read_bytes())
        if i % 2:
            data[-1] ^= 0xFF
        file.write_bytes(data if i % 2 else data[: len(data) // 2])
    third = kinetic.Model(path, n_ctx=1024, threads=2, cache_dir=tmp_path)
    assert tuple(third.generate(ids, max_tokens=8, return_tokens=True)) == cold
    assert third.last_stats.cached_tokens == 0


def _prompt_chunk_ends(model, monkeypatch, run, n_prompt: int) -> list[int]:
    """The end positions of the prompt chunks `run()` passes through the engine."""
    ends = []
    engine_run = model.engine.run

    def watched(parts):
        for part in parts:
            first = int(part.rows.positions[0])
            if part.commit and first < n_prompt:
                ends.append(int(part.rows.positions[-1]) + 1)
        engine_run(parts)

    monkeypatch.setattr(model.engine, "run", watched)
    run()
    monkeypatch.setattr(model.engine, "run", engine_run)
    return ends


@pytest.mark.parametrize("held", [False, True])
def test_warm_prompt_runs_the_cold_runs_chunks(held, monkeypatch):
    """A prompt resumed from a stored state starts on the grid, and every chunk it then runs ends
    where the cold run's chunks end (a held sequence cut back off the grid rejoins it at its first
    chunk), so warm and cold cut the prompt into the same batches."""
    model = kinetic.Model(synthetic_path("llama"), n_ctx=128, batch=4)
    rng = np.random.default_rng(3)
    first = [int(t) for t in rng.integers(1, 200, size=23)]
    second = first[:14] + [int(t) for t in rng.integers(1, 200, size=9)]
    model.generate(first, max_tokens=2)
    if not held:
        model._spare = None  # a fresh sequence: only the store can help
    warm_ends = _prompt_chunk_ends(model, monkeypatch, lambda: model.generate(second, max_tokens=2), len(second))
    cached = model.last_stats.cached_tokens
    cold = _cold(model)
    request = GenerationRequest(tuple(second), GREEDY, 2)
    cold_ends = _prompt_chunk_ends(model, monkeypatch, lambda: alone(cold, request), len(second))
    assert cached == (14 if held else 12)  # the store restores only at a grid point (a multiple of 4)
    assert warm_ends == [e for e in cold_ends if e > cached]


def _is_embedding(model) -> bool:
    from kinetic.runtime.embedding import is_embedding_graph

    return is_embedding_graph(model.graph)


@pytest.mark.parametrize("numerics", OTHER_NUMERICS)
def test_conversation_warm_equals_cold_in_every_other_numerics_mode(numerics):
    """In each numerics mode the default leaves out (tests/conftest.py OTHER_NUMERICS), each turn of a
    3-turn SmolLM2 conversation run warm gives bit for bit the cold tokens, greedy and seeded, and the
    later turns reuse prompt tokens."""
    model = kinetic.Model(model_path("smollm2-135m"), n_ctx=1024, threads=2, options=Options(numerics=numerics))
    assert model.options.numerics == numerics
    cold = _cold(model)
    for settings in (lambda turn: GREEDY, lambda turn: _seeded(200 + turn)):
        cached = _conversation(model, cold, settings, turns=3)
        assert all(c > 0 for c in cached[1:]), cached


@pytest.mark.parametrize("name", synthetic_files())
def test_synthetic_file_warm_equals_cold(name):
    """On every synthetic file, a prompt extending an earlier one (its answer and more tokens) and a
    prompt sharing only part of it give the cold tokens when started warm, greedy and seeded."""
    _synthetic_warm_equals_cold(name)


@pytest.mark.parametrize("numerics", OTHER_NUMERICS)
@pytest.mark.parametrize("name", NUMERICS_SYNTHETIC)
def test_synthetic_warm_equals_cold_in_every_other_numerics_mode(name, numerics):
    """In each numerics mode the default leaves out, warm prompts on a few synthetic files (every
    block-32 weight type, MoE experts, sliding windows) give the cold tokens, greedy and seeded."""
    _synthetic_warm_equals_cold(name, Options(numerics=numerics))


def _synthetic_warm_equals_cold(name: str, options: Options | None = None) -> None:
    model = kinetic.Model(synthetic_path(name), n_ctx=96, batch=4, options=options)
    if _is_embedding(model):
        pytest.skip("an embedding model generates nothing")
    cold = _cold(model)
    rng = np.random.default_rng(7)
    vocab = min(model.engine.n_vocab, 200)
    first = [int(t) for t in rng.integers(1, vocab, size=15)]
    answer = model.generate(first, max_tokens=6, return_tokens=True)
    longer = first + list(answer) + [int(t) for t in rng.integers(1, vocab, size=5)]
    branch = first[:10] + [int(t) for t in rng.integers(1, vocab, size=7)]
    for prompt, settings in ((longer, GREEDY), (branch, _seeded(5)), (longer, _seeded(6))):
        model.generate(prompt, max_tokens=6, sampling=settings)
        warm = model.last_stats.tokens  # an end-of-turn token included
        assert tuple(warm) == alone(cold, GenerationRequest(tuple(prompt), settings, 6)).tokens


def test_memory_tier_keeps_its_bound_over_200_prompts():
    """Over 200 different prompts the memory tier never holds more than its bound, drops the least
    recently used state first, and a prompt that extends a stored state replaces it."""
    model = kinetic.Model(synthetic_path("llama"), n_ctx=64, batch=4)
    engine = model.engine
    row_bytes = 2 * sum(engine.kv_width.values()) * np.dtype(engine.kv_dtype).itemsize
    bound = 40 * row_bytes
    store = WarmStore("0", batch=4, memory_bytes=bound)
    rng = np.random.default_rng(11)
    kept = []
    for _ in range(200):
        seq = engine.new_sequence()
        engine.feed(seq, [int(t) for t in rng.integers(1, 200, size=int(rng.integers(4, 30)))])
        store.keep(engine, seq)
        kept.append(list(seq.tokens))
        assert store.memory_used <= bound
    newest = np.asarray(kept[-1][:grid_floor(len(kept[-1]), 4)], np.int32)
    oldest = np.asarray(kept[0][:grid_floor(len(kept[0]), 4)], np.int32)
    states = list(store._states.values())
    assert any(common_prefix(s.tokens, newest) == len(newest) for s in states)
    assert not any(len(s.tokens) == len(oldest) and common_prefix(s.tokens, oldest) == len(oldest) for s in states)
    seq = engine.new_sequence()
    engine.feed(seq, kept[-1] + [5, 6, 7, 8, 9])
    store.keep(engine, seq)
    assert sum(common_prefix(s.tokens, newest) >= len(newest) for s in store._states.values()) == 1


def test_prefill_gives_way_to_a_request_which_continues_it(monkeypatch):
    """Zero Wait: a running prefill (prefill_only) ends after the pass it is in when a request comes;
    the request takes its slot, reuses every token it ran, and answers as a cold run does."""
    import queue
    import time

    from kinetic.runtime.scheduler import Scheduler

    model = kinetic.Model(synthetic_path("llama"), n_ctx=128, batch=4)
    model.engine.prompt_pass = 4  # one grid chunk a pass: the prefill has passes to give way between
    engine_run = model.engine.run
    monkeypatch.setattr(model.engine, "run", lambda parts: (time.sleep(0.05), engine_run(parts)))
    prompt = [int(t) for t in np.random.default_rng(5).integers(1, 200, size=80)]
    scheduler = Scheduler(model.generator, slots=1)
    scheduler.start()
    try:
        ahead, answer = queue.Queue(), queue.Queue()
        ticket = scheduler.submit(GenerationRequest(tuple(prompt), GREEDY, prefill_only=True), ahead.put)
        deadline = time.monotonic() + 30
        while (ticket.generation is None or ticket.generation.n_prompt_processed < 12) and time.monotonic() < deadline:
            time.sleep(0.01)
        request = GenerationRequest(tuple(prompt + [7, 8, 9]), GREEDY, 4)
        scheduler.submit(request, answer.put)
        prefilled = _finished(ahead)
        done = _finished(answer)
    finally:
        scheduler.stop()
    assert 12 <= prefilled.held_tokens < 80 and prefilled.held_tokens % 4 == 0 and prefilled.generated_tokens == 0
    assert done.cached_tokens >= prefilled.held_tokens
    assert tuple(done.tokens) == alone(_cold(model), request).tokens


def _finished(inbox):
    from kinetic.runtime.generation import Finished

    while True:
        event = inbox.get(timeout=60)
        if isinstance(event, Finished):
            return event
        assert not hasattr(event, "message"), event


def test_command_line_flags_choose_warm_start(tmp_path):
    """--no-prompt-cache and --off warm-start turn Warm Start off; --cache-dir moves its disk tier,
    which is kinetic/warm in the user's cache folder by default."""
    from argparse import Namespace

    from kinetic.cli.runtime_options import warm_settings
    from kinetic.runtime.warm_disk import default_directory

    def settings(**given):
        return warm_settings(Namespace(**{"no_prompt_cache": False, "off": None, "cache_dir": None, **given}))

    assert settings(no_prompt_cache=True) == {"warm_start": False}
    assert settings(off="rad1,warm-start") == {"warm_start": False}
    assert settings(cache_dir=str(tmp_path)) == {"warm_start": True, "cache_dir": str(tmp_path)}
    assert settings() == {"warm_start": True, "cache_dir": default_directory()}


def test_a_restore_must_cost_less_than_the_prompt_it_saves():
    """Before speeds are measured a restore counts as cheaper; once measured, a restore is chosen
    only when its bytes cost less time than computing its tokens."""
    from kinetic.runtime.warm_costs import DISK, RestoreCosts

    costs = RestoreCosts()
    assert costs.worth(DISK, 128, 10 << 20)
    assert not costs.worth(DISK, 0, 1)
    costs.observe_prefill(1000, 1.0)  # 1 ms per token
    costs.observe_restore(DISK, 100 << 20, 1.0)  # 100 MiB/s
    assert costs.worth(DISK, 128, 1 << 20)  # 10 ms to read, 128 ms to compute
    assert not costs.worth(DISK, 128, 50 << 20)  # 500 ms to read


def test_convoy_of_warm_answers_equals_cold_answers():
    """Requests sharing a long prefix, run by the scheduler's slots at once (twice: the second round
    starts from the slots' sequences and the store), each give the cold answer alone, and the second
    round reuses prompt tokens."""
    from tests.runtime.convoy_helpers import convoy

    model = kinetic.Model(synthetic_path("llama"), n_ctx=128, batch=4)
    rng = np.random.default_rng(9)
    shared = [int(t) for t in rng.integers(1, 200, size=30)]
    requests = [GenerationRequest(tuple(shared + [int(t) for t in rng.integers(1, 200, size=n)]),
                                  GREEDY if n % 2 else _seeded(n), max_tokens=6, ignore_eos=True)
                for n in (3, 6, 9, 12)]
    cold = [alone(_cold(model), r) for r in requests]
    for _ in range(2):
        answers, scheduler = convoy(model.generator, requests, slots=3, together=3)
        assert answers == cold
    assert scheduler.counters.prompt_tokens_cached_total > 0


def test_the_warm_directory_follows_kinetic_warm_dir(monkeypatch, tmp_path):
    """KINETIC_WARM_DIR moves Warm Start's default directory (the test suite's points at a temporary
    folder, never the user's cache); unset, it is kinetic/warm in the user's cache folder."""
    import os
    from pathlib import Path

    from kinetic.runtime.warm_disk import default_directory
    from kinetic.user_cache import cache_dir

    assert os.environ.get("KINETIC_WARM_DIR") and default_directory() != cache_dir("warm")
    monkeypatch.setenv("KINETIC_WARM_DIR", str(tmp_path))
    assert default_directory() == Path(tmp_path)
    monkeypatch.delenv("KINETIC_WARM_DIR")
    assert default_directory() == cache_dir("warm")
