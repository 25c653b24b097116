"""Where the output layer runs (kinetic/runtime/output_layer.py): a pass that needs every logit runs the
full graph, a pass that may shortlist runs whichever way has lately been faster, and either way every
logit a request reads is the full layer's, bit for bit."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kinetic.ir.rows import PassRows
from kinetic.model import Model
from kinetic.runtime.engine import Engine, SeqRows
from kinetic.runtime.output_layer import MANY_ROWS, FasterOfTwo
from kinetic.runtime.weights import GGUFWeights
from tests.runtime.decoding_helpers import greedy_with_scores

PROMPT = [504, 3575, 282, 4649, 314, 7042, 30, 198, 198, 504]  # "The capital of France is Paris.\n\nThe"


@pytest.fixture(scope="module")
def pair(smollm2_path):
    """(SmolLM2 with Shortlist, an engine on the same weights without it)."""
    model = Model(smollm2_path, n_ctx=256, threads=2)
    plain = Engine(model.graph, GGUFWeights(model.gguf), n_ctx=256, threads=2, shortlist=False)
    return model.engine, plain


def test_a_pass_that_needs_every_logit_runs_the_full_graph(pair):
    """top 0: the full graph's pass gives the logits (no shortlist call), the plain engine's bit for bit."""
    engine, plain = pair
    calls = engine.head.calls
    rows = PassRows.chain(PROMPT, 0, outputs="all")
    got = engine.forward(rows, {0: engine.new_sequence()}, commit=False)
    assert engine.output.full is not None and engine.head.calls == calls
    assert np.array_equal(got, plain.forward(rows, {0: plain.new_sequence()}, commit=False))


def test_both_ways_give_the_full_layers_greedy_tokens_and_scores(pair):
    """Greedy decoding while the measured choice tries both ways (the full graph and the cut graph with
    Shortlist's head) gives the plain engine's tokens and scores bit for bit."""
    engine, plain = pair
    engine.output.choices.clear()
    steps = 3 * FasterOfTwo.PROBES
    assert greedy_with_scores(engine, PROMPT, steps, 1) == greedy_with_scores(plain, PROMPT, steps, 0)
    tried = engine.output.choices[1].recent
    assert min(len(tried[True]), len(tried[False])) >= FasterOfTwo.START  # each way ran its probes


def test_the_ways_are_probed_in_turn_then_the_faster_runs_and_the_other_is_retried():
    """Scripted times: the two ways alternate until each has START times, then the faster (by its
    fastest recent time) runs, the other every EXPLORE calls, and a retried way that has become the
    faster takes over."""
    choice, times, ways = FasterOfTwo(), {True: 2.0, False: 3.0}, []
    for call in range(1, 3 * FasterOfTwo.EXPLORE + 1):
        if call == 2 * FasterOfTwo.EXPLORE:
            times[False] = 1.0  # the full graph became faster (less load, another context length)
        way = choice.pick()
        ways.append(way)
        choice.record(way, times[way])
    start = 2 * FasterOfTwo.START
    assert ways[:start] == [True, False] * FasterOfTwo.START
    assert [i for i, way in enumerate(ways[start:], start + 1) if not way][:2] == [16, 32]
    assert not any(ways[2 * FasterOfTwo.EXPLORE:-1]) and ways[-1]  # then the shortlist is the one retried


def test_the_choice_follows_the_wall_clock_not_the_calling_threads_cpu(pair, monkeypatch):
    """A full pass during which the calling thread slept (as when the compiled pass's workers run
    the shares of a caller that is off its core) costs what the caller waited: the choice takes the
    way faster on the clock, though it spent more of the calling thread's CPU time."""
    engine, plain = pair
    output, ways = engine.output, []
    full, shortlist = output._full_pass, output._shortlist_pass

    def slept(*args):
        ways.append(False)
        time.sleep(0.05)
        return full(*args)

    def spun(*args):
        ways.append(True)
        end = time.thread_time() + 0.01
        while time.thread_time() < end:
            pass
        return shortlist(*args)

    monkeypatch.setattr(output, "_full_pass", slept)
    monkeypatch.setattr(output, "_shortlist_pass", spun)
    output.choices.clear()
    steps = 2 * FasterOfTwo.START + 4  # and the prompt's pass: none of them an exploring call
    assert greedy_with_scores(engine, PROMPT, steps, 1) == greedy_with_scores(plain, PROMPT, steps, 0)
    assert ways[:2 * FasterOfTwo.START] == [True, False] * FasterOfTwo.START
    assert all(ways[2 * FasterOfTwo.START:])


def test_the_choice_is_measured_per_count_of_output_rows(pair):
    """A pass of 3 output rows and one of MANY_ROWS or more never share a one-row pass's measurements."""
    engine, _ = pair
    engine.output.choices.clear()
    for n in (1, 3, MANY_ROWS + 2):
        rows = PassRows.chain(PROMPT[:n], 0, outputs="all")
        engine.forward(rows, {0: engine.new_sequence()}, commit=False, top=1)
    assert sorted(engine.output.choices) == [1, 3, MANY_ROWS]
    assert all(c.calls == 1 for c in engine.output.choices.values())


@pytest.mark.parametrize("shortlisting", [True, False])
def test_parts_of_one_pass_with_different_tops_read_the_full_layers_logits(pair, shortlisting):
    """Two sequences in one pass, one greedy (top 1) and one needing every logit (top 0): the second
    gets the plain engine's logits bit for bit, the first its best token and score, whichever way ran."""
    engine, plain = pair
    engine.output.adaptive = not shortlisting  # off: shortlist whenever a part may
    engine.output.choices.clear()
    if not shortlisting:  # a choice that has measured the full graph faster
        choice = engine.output.choices.setdefault(2, FasterOfTwo())
        for way in (True, False):
            choice.recent[way].extend([2.0 if way else 1.0] * FasterOfTwo.PROBES)
    calls = engine.head.calls
    parts = [SeqRows(engine.new_sequence(), PassRows.chain(PROMPT[:4], 0), top=1),
             SeqRows(engine.new_sequence(), PassRows.chain(PROMPT[:6], 0), top=0)]
    engine.run(parts)
    engine.output.adaptive = True
    want = [plain.prefill(plain.new_sequence(), PROMPT[:n]) for n in (4, 6)]
    assert (engine.head.calls > calls) == shortlisting
    best = int(np.argmax(want[0]))
    assert int(np.argmax(parts[0].logits[0])) == best and parts[0].logits[0, best] == want[0][best]
    assert np.array_equal(parts[1].logits[0], want[1])
