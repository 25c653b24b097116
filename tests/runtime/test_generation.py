"""The runtime's one generation loop and its scheduler, on the real SmolLM2 model."""

from __future__ import annotations

import queue
import threading

import pytest

import kinetic
from kinetic.runtime.generation import Finished, GenerationRequest, Piece
from kinetic.runtime.sampling import SamplingSettings
from kinetic.runtime.scheduler import Failed, Scheduler, SchedulerBusy

GREEDY = SamplingSettings(temperature=0.0, seed=1)


@pytest.fixture(scope="module")
def model(smollm2_path):
    return kinetic.Model(smollm2_path, n_ctx=512)


def _events(model, request, cancelled=None) -> list:
    return list(model.generator.generate(request, cancelled))


def test_chunked_prompt_gives_the_tokens_of_one_prefill(model):
    """A prompt longer than the engine's chunk, fed chunk by chunk with cancellation checks between,
    gives the tokens the engine's own prefill gives (greedy from Engine.prefill's logits)."""
    ids = model.tokenize("The quick brown fox jumps over the lazy dog. " * 30)
    assert len(ids) > model.engine.batch
    events = _events(model, GenerationRequest(tuple(ids), GREEDY, max_tokens=6, draft=False))
    done = events[-1]
    assert isinstance(done, Finished) and done.generated_tokens == 6 and done.finish_reason == "length"
    plain = list(model.engine.greedy(model.engine.new_sequence(), ids, 6))
    assert done.tokens == plain


def test_stop_string_is_never_sent(model):
    """The text before a stop string goes out, the stop string and what follows never do, and the
    tokens sent are those whose text was sent."""
    ids = tuple(model.tokenize("Count: one, two, three, four, five, six,"))
    free = "".join(e.text for e in _events(model, GenerationRequest(ids, GREEDY, max_tokens=12))
                   if isinstance(e, Piece))
    word = free.strip().split()[1]  # a word the greedy answer will reach
    events = _events(model, GenerationRequest(ids, GREEDY, max_tokens=12, stop=(word,)))
    sent = "".join(e.text for e in events if isinstance(e, Piece))
    done = events[-1]
    assert done.stop_type == "word" and done.stopping_word == word
    assert sent == free[:free.index(word)]
    sent_tokens = [t.id for e in events if isinstance(e, Piece) for t in e.tokens]
    assert model.detokenize(sent_tokens).startswith(sent)


def test_cancelled_generation_stops_within_a_pass(model):
    """Setting the cancel flag after the first token ends the answer at once: no more passes run."""
    ids = tuple(model.tokenize("Count: one, two, three, four, five, six,"))
    cancel = threading.Event()
    generation = model.generator.generate(GenerationRequest(ids, GREEDY, max_tokens=50), cancel)
    passes = None
    for event in generation:
        if isinstance(event, Piece) and event.tokens and passes is None:
            cancel.set()
            passes = model.engine.passes
    assert model.engine.passes == passes and generation.n_decoded == 1


def test_model_generate_equals_the_generation_loop(model):
    """Model.generate is an adapter over the runtime's loop: the same tokens and statistics."""
    ids = model.tokenize("The capital of France is")
    tokens = model.generate(ids, max_tokens=8, return_tokens=True)
    events = _events(model, GenerationRequest(tuple(ids), GREEDY, max_tokens=8))
    assert [t.id for e in events if isinstance(e, Piece) for t in e.tokens] == tokens
    assert model.last_stats.tokens == events[-1].tokens


def test_scheduler_runs_in_order_counts_and_refuses_beyond_its_queue(model):
    """Tickets run one at a time in arrival order; a ticket cancelled while waiting never runs; the
    counters add up the answers' tokens and passes; submit beyond max_queued raises SchedulerBusy."""
    scheduler = Scheduler(model.generator, max_queued=3)
    inbox: queue.Queue = queue.Queue()
    ids = tuple(model.tokenize("Hello"))
    tickets = [scheduler.submit(GenerationRequest(ids, GREEDY, max_tokens=3),
                                lambda event, i=i: inbox.put((i, event))) for i in range(3)]
    with pytest.raises(SchedulerBusy):
        scheduler.submit(GenerationRequest(ids, GREEDY, max_tokens=3), inbox.put)
    tickets[1].cancelled.set()
    passes = model.engine.passes
    scheduler.start()
    finished = []
    while len(finished) < 2:
        i, event = inbox.get(timeout=120)
        assert not isinstance(event, Failed)
        if isinstance(event, Finished):
            finished.append((i, event))
    scheduler.stop()
    assert [i for i, _ in finished] == [0, 2]
    c = scheduler.counters
    assert c.requests_total == 2 and c.tokens_predicted_total == 6
    assert c.n_decode_total == model.engine.passes - passes == sum(e.passes for _, e in finished)


def test_scheduler_reports_a_refused_request_as_failed(model):
    """A request the engine refuses (a sampler it cannot build) comes back as one Failed event, and
    the scheduler goes on serving."""
    scheduler = Scheduler(model.generator)
    inbox: queue.Queue = queue.Queue()
    ids = tuple(model.tokenize("Hello"))
    bad = SamplingSettings(temperature=0.0, seed=1, logit_bias=((10**7, 1.0),))  # outside the vocabulary
    scheduler.start()
    try:
        scheduler.submit(GenerationRequest(ids, bad, max_tokens=2), inbox.put)
        scheduler.submit(GenerationRequest(ids, GREEDY, max_tokens=2), inbox.put)
        first = inbox.get(timeout=120)
        events = [inbox.get(timeout=120)]
        while not isinstance(events[-1], Finished):
            events.append(inbox.get(timeout=120))
    finally:
        scheduler.stop()
    assert isinstance(first, Failed) and not first.internal
