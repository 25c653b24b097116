"""Convoy's fairness: a long prompt already being read does not hold back short requests that
arrive behind it (kinetic/runtime/convoy.py: the least advanced prompt's chunk goes first). On the
synthetic llama file: the policy does not depend on the model, and a 3,000-token prompt takes
SmolLM2 about a minute on this machine's CPUs."""

from __future__ import annotations

import queue
import time

import pytest

import kinetic
from kinetic.runtime.generation import GenerationRequest
from kinetic.runtime.sampling import SamplingSettings
from kinetic.runtime.scheduler import Failed, Scheduler
from tests.synthetic import synthetic_path

GREEDY = SamplingSettings(temperature=0.0, seed=1)
LONG_TOKENS = 3000


@pytest.fixture(scope="module")
def model():
    return kinetic.Model(synthetic_path("llama"), n_ctx=4096)


def test_short_requests_get_their_first_token_before_a_long_prompt_is_read(model):
    """A 3,000-token prompt arrives first and starts; three short requests arriving behind it each
    get their first token before the long one has finished reading its prompt."""
    scheduler = Scheduler(model.generator, slots=4)
    inbox: queue.Queue = queue.Queue()
    shorts = [GenerationRequest(tuple(range(first, first + n)), GREEDY, max_tokens=4, ignore_eos=True)
              for first, n in ((10, 5), (40, 9), (90, 7))]
    firsts: list[int] = []  # request index of each first event, in the order they came
    scheduler.start()
    try:
        prompt = tuple(1 + i % 200 for i in range(LONG_TOKENS))
        long = scheduler.submit(GenerationRequest(prompt, GREEDY, max_tokens=1, ignore_eos=True),
                                lambda e: inbox.put((0, e)))
        while long.n_prompt_processed == 0:  # the long prompt is being read
            time.sleep(0.001)
        for i, request in enumerate(shorts, start=1):
            scheduler.submit(request, lambda e, i=i: inbox.put((i, e)))
        while len(firsts) < 1 + len(shorts):
            i, event = inbox.get(timeout=300)
            assert not isinstance(event, Failed), event.message
            if i not in firsts:
                firsts.append(i)
    finally:
        scheduler.stop()
    assert long.generation.n_prompt_processed == LONG_TOKENS
    assert firsts[-1] == 0, f"first events in order {firsts}: a short request waited for the long prompt"
