"""Convoy, the identity gate: every answer run by the scheduler beside others is bit for bit the
answer it gets alone (greedy, seeded sampling, a grammar, drafting on), on both real models and on
synthetic files of several families; and the pass policy (kinetic/runtime/convoy.py)."""

from __future__ import annotations

import queue
from dataclasses import dataclass

import numpy as np
import pytest

import kinetic
from kinetic import devices
from kinetic.errors import KineticError
from kinetic.frontend.blocks import Options
from kinetic.grammar import GrammarMatcher, TokenVocab, parse_gbnf
from kinetic.ir.rows import PassRows
from kinetic.runtime import scheduler as scheduler_module
from kinetic.runtime.convoy import PassBudget, compose
from kinetic.runtime.engine import SeqRows
from kinetic.runtime.generation import Finished, GenerationRequest, Piece
from kinetic.runtime.sampling import SamplingSettings
from kinetic.runtime.scheduler import Scheduler
from tests.conftest import NUMERICS_SYNTHETIC, OTHER_NUMERICS
from tests.device_checks import FixedCosts
from tests.runtime.convoy_helpers import alone, answer_of, convoy, shared_passes
from tests.synthetic import synthetic_files, synthetic_path

GREEDY = SamplingSettings(temperature=0.0, seed=1)


def _seeded(seed: int) -> SamplingSettings:
    return SamplingSettings(temperature=0.9, top_k=40, seed=seed)


def _requests(model, grammar: GrammarMatcher | None) -> list[GenerationRequest]:
    """Requests of different prompt and answer lengths: greedy, seeded, drafted (a repetitive prompt
    RAD-1 drafts on), a long prompt of several chunks, one held to a grammar."""
    def ids(text):
        return tuple(model.tokenize(text))

    count = ids("Count: one, two, three, four, five, six, seven, eight, nine, ten, one, two, three, four,")
    long = ids("The quick brown fox jumps over the lazy dog. " * 16)  # more than one chunk of 128
    reqs = [
        GenerationRequest(ids("The capital of France is"), GREEDY, max_tokens=10, draft=False),
        GenerationRequest(ids("Once upon a time"), _seeded(7), max_tokens=14),
        GenerationRequest(count, GREEDY, max_tokens=16, draft=True),
        GenerationRequest(long, _seeded(3), max_tokens=6),
        GenerationRequest(ids("Write a word:"), _seeded(11), max_tokens=12, stop=("\n",)),
    ]
    if grammar is not None:
        reqs.append(GenerationRequest(ids("Answer yes or no:"), _seeded(5), max_tokens=8, grammar=grammar))
    return reqs


def _gate(model, requests, slots, together=2):
    expected = [alone(model.generator, r) for r in requests]
    got, scheduler = convoy(model.generator, requests, slots=slots, together=together)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g == e, f"request {i}: convoy {g} != alone {e}"
    assert shared_passes(got, scheduler), "no pass held several answers' rows"


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return kinetic.Model(smollm2_path, n_ctx=512)


@pytest.fixture(scope="module")
def gemma(gemma_path):
    return kinetic.Model(gemma_path, n_ctx=512)


def _grammar(model) -> GrammarMatcher:
    return GrammarMatcher(parse_gbnf('root ::= " " ("yes" | "no") "."\n'), TokenVocab.from_tokenizer(model.tokenizer))


def test_smollm2_convoy_equals_alone(smollm2):
    """Six SmolLM2 requests (greedy, seeded, drafted, a grammar, a two-chunk prompt), arriving at
    different times into 4 slots, each give bit for bit their answer alone, and passes were shared."""
    _gate(smollm2, _requests(smollm2, _grammar(smollm2)), slots=4)


def test_gemma3_convoy_equals_alone(gemma):
    """Gemma 3 (sliding-window layers): eight requests into 8 slots, three at once and the rest while
    others decode, each give their answer alone, and passes were shared."""
    more = [GenerationRequest(tuple(gemma.tokenize(text)), _seeded(seed), max_tokens=n)
            for text, seed, n in (("Hi", 21, 5), ("Name three colors:", 22, 9), ("2 + 2 =", 23, 3))]
    _gate(gemma, _requests(gemma, None) + more, slots=8, together=3)


@pytest.mark.parametrize("numerics", OTHER_NUMERICS)
def test_smollm2_convoy_equals_alone_in_every_other_numerics_mode(smollm2_path, numerics):
    """In each numerics mode the default leaves out (tests/conftest.py OTHER_NUMERICS), SmolLM2's
    requests (greedy, seeded, drafted, a grammar, a two-chunk prompt) into 4 slots each give bit for
    bit their answer alone, and passes were shared."""
    model = kinetic.Model(smollm2_path, n_ctx=512, options=Options(numerics=numerics))
    assert model.options.numerics == numerics
    _gate(model, _requests(model, _grammar(model)), slots=4)


def _synthetic_gate(name: str, options: Options | None = None) -> None:
    model = kinetic.Model(synthetic_path(name), n_ctx=64, options=options)
    n_vocab = model.engine.n_vocab
    rng = np.random.default_rng(0)
    prompts = [tuple(int(t) for t in rng.integers(1, min(n_vocab, 200), size=n)) for n in (5, 17, 9)]
    requests = [GenerationRequest(prompts[0], GREEDY, max_tokens=8, ignore_eos=True),
                GenerationRequest(prompts[1], _seeded(2), max_tokens=5, ignore_eos=True),
                GenerationRequest(prompts[2], _seeded(9), max_tokens=10, ignore_eos=True)]
    _gate(model, requests, slots=3)


@pytest.mark.parametrize("name", synthetic_files())
def test_synthetic_family_convoy_equals_alone(name):
    """On every family's synthetic files (each shape), three requests of token ids sharing passes
    each give their answer alone (greedy and seeded)."""
    _synthetic_gate(name)


@pytest.mark.parametrize("numerics", OTHER_NUMERICS)
@pytest.mark.parametrize("name", NUMERICS_SYNTHETIC)
def test_synthetic_convoy_equals_alone_in_every_other_numerics_mode(name, numerics):
    """In each numerics mode the default leaves out, three requests sharing passes on a few synthetic
    files (every block-32 weight type, MoE experts, sliding windows) each give their answer alone."""
    _synthetic_gate(name, Options(numerics=numerics))


@pytest.mark.parametrize("device", ["cpu", "reference", "vulkan", "cuda-emulated"])
def test_draft_trees_verify_beside_other_sequences(device, monkeypatch):
    """Draft trees of several sequences verify in shared passes (the compiled step writing rows in
    place, the reference returning them for the engine to commit, Vulkan and the CUDA emulation in
    their cache pools), and every drafted answer is its answer alone."""
    reason = devices.DEVICES[device].unavailable()
    if reason:
        pytest.skip(f"--device {device} cannot run here: {reason}")
    model = kinetic.Model(synthetic_path("llama"), n_ctx=64, device=device)
    model.generator.decoder.costs = FixedCosts()  # drafting decided by acceptance alone, not the clock
    shared_trees = []
    run = model.engine.run

    def watched_run(parts):
        shared_trees.append(len(parts) > 1 and any(not p.commit for p in parts))
        run(parts)

    monkeypatch.setattr(model.engine, "run", watched_run)
    requests = [GenerationRequest(tuple(p), GREEDY, max_tokens=n, ignore_eos=True, draft=True)
                for p, n in (([5, 6, 7, 8] * 4, 12), ([9, 10, 11] * 5, 10), ([3, 4] * 6, 14))]
    _gate(model, requests, slots=3, together=3)
    assert any(shared_trees), "no draft tree shared a pass"


def test_one_slot_never_shares_a_pass(smollm2):
    """One slot: every pass holds one answer's rows (as many passes as the answers had)."""
    requests = _requests(smollm2, None)[:3]
    got, scheduler = convoy(smollm2.generator, requests, slots=1, together=3)
    assert not shared_passes(got, scheduler)


def test_device_with_one_sequence_per_pass_gets_one_slot(smollm2, monkeypatch):
    """A device declaring one sequence per pass (Capabilities.max_sequences) gets one slot."""
    monkeypatch.setattr(type(smollm2.engine), "max_sequences", property(lambda self: 1))
    assert Scheduler(smollm2.generator, slots=4).slots == 1


def test_cancelled_answer_leaves_at_the_next_pass(smollm2):
    """A request cancelled after its first text leaves (Finished "length", few tokens) while the
    others, sharing its passes, still get their answers alone."""
    requests = _requests(smollm2, None)[:3]
    long = GenerationRequest(requests[1].prompt, GREEDY, max_tokens=200, ignore_eos=True, draft=False)
    expected = [alone(smollm2.generator, r) for r in (requests[0], requests[2])]
    scheduler = Scheduler(smollm2.generator, slots=3)
    inbox: queue.Queue = queue.Queue()
    tickets = [scheduler.submit(r, lambda e, i=i: inbox.put((i, e)))
               for i, r in enumerate((requests[0], long, requests[2]))]
    events: list[list] = [[], [], []]
    scheduler.start()
    try:
        while sum(isinstance(e[-1], Finished) for e in events if e) < 3:
            i, event = inbox.get(timeout=120)
            events[i].append(event)
            if i == 1 and isinstance(event, Piece) and event.text:
                tickets[1].cancelled.set()
    finally:
        scheduler.stop()
    done = events[1][-1]
    assert done.finish_reason == "length" and done.generated_tokens < 20
    assert [answer_of(events[0]), answer_of(events[2])] == expected


def test_slots_that_do_not_fit_in_memory_are_refused(smollm2, monkeypatch):
    """The default slot count shrinks to the caches that fit; an explicit count that does not fit
    is refused with a KineticError naming --parallel."""
    one_cache = 2 * 512 * sum(smollm2.engine.kv_width.values()) * 2
    monkeypatch.setattr(scheduler_module, "available_memory", lambda: 2 * one_cache + 1)
    assert Scheduler(smollm2.generator, slots=None).slots == 2
    with pytest.raises(KineticError, match="--parallel"):
        Scheduler(smollm2.generator, slots=3).check_memory()


# ---- the pass policy ---------------------------------------------------------------------------

@dataclass
class _Member:
    id: int
    n_rows: int
    decoding: bool
    n_prompt_processed: int = 0

    @property
    def want(self) -> SeqRows:
        return SeqRows(None, PassRows.chain(list(range(self.n_rows)), 0))


def test_compose_takes_every_decoder_and_one_chunk_of_prompt():
    """Every decoding answer is in the pass; prompt chunks join within the prompt-row budget, the
    least advanced prompt first, and one chunk always joins."""
    members = [_Member(1, 128, False, 256), _Member(2, 1, True), _Member(3, 40, False, 0),
               _Member(4, 9, True), _Member(5, 100, False, 0)]
    chosen = compose(members, PassBudget(prompt_rows=128))
    assert [m.id for m in chosen] == [2, 4, 3]  # decoders, then 40 rows of the least advanced prompt
    assert [m.id for m in compose(members[:1], PassBudget(prompt_rows=16))] == [1]


def test_compose_keeps_to_the_device_row_limit():
    """On a device with a row limit, parts join while they fit (the first always)."""
    members = [_Member(1, 10, True), _Member(2, 10, True), _Member(3, 1, True)]
    assert [m.id for m in compose(members, PassBudget(prompt_rows=128, max_rows=12))] == [1, 3]
    assert [m.id for m in compose(members[:1], PassBudget(prompt_rows=128, max_rows=4))] == [1]


def test_a_prompt_beside_others_reads_one_chunk_a_pass_and_alone_the_big_passes(monkeypatch):
    """A long prompt running alone takes passes of several grid chunks (Engine.prompt_pass); beside
    another answer every pass holds at most one chunk of it, but for the one pass it had asked for
    before the other arrived (scheduler._bound_prompt)."""
    model = kinetic.Model(synthetic_path("llama"), n_ctx=2048)
    engine = model.generator.engine
    assert engine.prompt_pass > engine.batch
    sizes: list[list[int]] = []  # each pass: its parts' row counts
    run = engine.run
    monkeypatch.setattr(engine, "run", lambda parts: (sizes.append([len(p.rows.tokens) for p in parts]), run(parts))[1])
    long = GenerationRequest(tuple(1 + i % 200 for i in range(1800)), GREEDY, max_tokens=1, ignore_eos=True)
    short = GenerationRequest(tuple(range(10, 15)), GREEDY, max_tokens=40, ignore_eos=True)
    scheduler = Scheduler(model.generator, slots=2)
    inbox: queue.Queue = queue.Queue()
    scheduler.start()
    try:
        scheduler.submit(long, lambda e: inbox.put((0, e)))
        while not sizes:
            pass
        scheduler.submit(short, lambda e: inbox.put((1, e)))
        finished = 0
        while finished < 2:
            finished += isinstance(inbox.get(timeout=300)[1], Finished)
    finally:
        scheduler.stop()
    assert max(sizes[0]) > engine.batch  # alone: a big pass
    shared = [s for s in sizes if len(s) > 1]
    assert shared, "the two answers never shared a pass"
    assert sum(max(s) > engine.batch for s in shared) <= 1
