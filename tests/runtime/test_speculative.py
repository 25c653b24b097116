"""RAD-1: drafted decoding gives plain decoding's tokens (greedy and seeded sampling), keeps accepted
rows' cache entries bit for bit as plain decoding writes them, and its drafters stay bounded."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

import kinetic
from kinetic.frontend.blocks import Options
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.runtime.drafting import (
    CONTEXT_ORDERS,
    ContextDrafter,
    DraftPolicy,
    DraftTree,
    NgramIndex,
    PassCosts,
    Proposal,
    build_tree,
)
from kinetic.runtime.engine import Engine
from kinetic.runtime.speculative import DraftStats, GreedyPicker, SpeculativeDecoder, accept_draft, plain_decode
from kinetic.runtime.weights import GGUFWeights
from tests.conftest import NUMERICS_SYNTHETIC, OTHER_NUMERICS, model_path
from tests.device_checks import FixedCosts
from tests.synthetic import synthetic_path

CODE = '''def total(items):
    count = 0
    for item in items:
        count += item.price * item.quantity
    return count


def average(items):
    return total(items) / len(items)
'''
REPEAT = "Repeat this code exactly:\n\n" + CODE + "\nHere it is again:\n\n"
LOOP = "x = 1\ny = 2\nx = 1\ny = 3\nx = 1\ny = 2\nx = 1\ny = 3\nx = 1\ny ="  # earlier occurrences disagree
STORY = "Once upon a time, in a village by the sea, there lived a girl who"


class InverseCdfPicker:
    """A seeded sampler for the tests: softmax at a temperature, one uniform number per token,
    inverted through the CDF (what kinetic.Model does with a temperature)."""

    def __init__(self, temperature: float, seed: int):
        self.temperature = temperature
        self.rng = np.random.default_rng(seed)
        self.history: list[int] = []

    def next_uniform(self) -> float:
        return float(self.rng.random())

    def choose(self, logits: np.ndarray, u: float) -> int:
        z = logits.astype(np.float64) / self.temperature
        p = np.exp(z - z.max())
        cdf = np.cumsum(p / p.sum())
        return int(min(np.searchsorted(cdf, u, side="right"), len(cdf) - 1))

    def accept(self, token: int) -> None:
        self.history.append(token)


@pytest.fixture(scope="module")
def model(smollm2_path) -> kinetic.Model:
    return kinetic.Model(smollm2_path, n_ctx=512)


@pytest.fixture(scope="module")
def engine(model) -> Engine:
    return model.engine


def one_hot(*tops: int, n_vocab: int = 8) -> np.ndarray:
    logits = np.zeros((len(tops), n_vocab), np.float32)
    logits[np.arange(len(tops)), tops] = 1.0
    return logits


# -- the acceptance rule -----------------------------------------------------------------------------

def test_accept_keeps_a_chain_the_model_agrees_with_and_adds_one():
    """Guesses equal to the top token are all kept, and the last row gives one more token."""
    tree = DraftTree([5, 1, 2], [-1, 0, 1])
    path, out = accept_draft(tree, one_hot(1, 2, 3), GreedyPicker(), limit=10, stop=())
    assert (path, out) == ([0, 1, 2], [1, 2, 3])


def test_accept_stops_at_the_first_mismatch_with_the_corrected_token():
    """The first guess the model disagrees with ends the walk; its token is the model's, the rest dropped."""
    tree = DraftTree([5, 1, 2, 3], [-1, 0, 1, 2])
    path, out = accept_draft(tree, one_hot(1, 4, 3, 3), GreedyPicker(), limit=10, stop=())
    assert (path, out) == ([0, 1], [1, 4])


def test_accept_follows_the_branch_the_model_picks():
    """In a tree, the walk moves to whichever child guessed the top token (here the second branch)."""
    tree = DraftTree([5, 1, 6, 7], [-1, 0, 0, 2])  # root -> 1 | root -> 6 -> 7
    path, out = accept_draft(tree, one_hot(6, 0, 7, 2), GreedyPicker(), limit=10, stop=())
    assert (path, out) == ([0, 2, 3], [6, 7, 2])


def test_accept_ends_at_a_stop_token_and_at_the_limit():
    """A stop token or the token limit ends generation even inside accepted guesses."""
    tree = DraftTree([5, 1, 2], [-1, 0, 1])
    assert accept_draft(tree, one_hot(1, 2, 3), GreedyPicker(), limit=10, stop={2}) == ([0, 1], [1, 2])
    assert accept_draft(tree, one_hot(1, 2, 3), GreedyPicker(), limit=2, stop=()) == ([0, 1], [1, 2])


def test_greedy_ties_go_to_the_lowest_id():
    """On a tie, greedy picks the lowest token id, as plain decoding's argmax does."""
    logits = np.zeros((1, 8), np.float32)
    logits[0, [3, 6]] = 2.0
    assert accept_draft(DraftTree([5], [-1]), logits, GreedyPicker(), limit=1, stop=()) == ([0], [3])


def test_sampled_acceptance_draws_one_number_per_generated_token():
    """Sampling draws exactly one uniform per generated token, whatever the tree holds."""
    rng_logits = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    picker = InverseCdfPicker(1.0, seed=3)
    tree = DraftTree([5, 1, 2, 3], [-1, 0, 1, 2])
    _, out = accept_draft(tree, rng_logits, picker, limit=10, stop=())
    reference = np.random.default_rng(3)
    for _ in out:
        reference.random()
    assert picker.rng.random() == reference.random()


# -- drafters and policy -------------------------------------------------------------------------------

def test_index_stays_within_its_memory_bound():
    """The index allocates its memory once: feeding ten times its budget neither grows it nor drafts
    from overwritten tokens, and the newest tokens still draft."""
    index = NgramIndex(budget=1000, orders=(3, 2))
    size = index.nbytes
    rng = np.random.default_rng(0)
    old = [7, 8, 9, 10, 11]
    index.extend(old + rng.integers(100, 50000, 10_000).tolist())
    recent = [21, 22, 23, 24, 25]
    index.extend(recent + rng.integers(100, 50000, 50).tolist())
    assert index.nbytes == size
    assert index.continuations([7, 8, 9], 2) == (0, [])
    assert index.continuations([21, 22, 23], 2) == (3, [[24, 25]])


def test_index_appended_token_by_token_equals_appended_at_once():
    """Building the index one token at a time or in one call gives the same lookups."""
    tokens = np.random.default_rng(1).integers(0, 6, 300).tolist()
    one, many = NgramIndex(128, orders=CONTEXT_ORDERS), NgramIndex(128, orders=CONTEXT_ORDERS)
    one.extend(tokens)
    for t in tokens:
        many.extend([t])
    for end in range(10, 300, 7):
        query = tokens[end - 8 : end]
        assert one.continuations(query, 5) == many.continuations(query, 5)


def test_context_drafter_branches_on_disagreeing_occurrences():
    """The latest occurrence drafts first; an earlier one with another continuation becomes a branch."""
    drafter = ContextDrafter(64, orders=(2,))
    context = [1, 2, 3, 4, 9, 1, 2, 5, 6, 9, 1, 2]
    proposal = drafter.propose(context, 3)
    assert proposal == Proposal("context/2", [[5, 6, 9], [3, 4, 9]])
    tree = build_tree(2, proposal.branches, rows=3, spare=1)
    assert tree == DraftTree([2, 5, 6, 9, 3], [-1, 0, 1, 2, 0])


def test_context_drafter_continues_a_loop_whose_halves_differ_in_one_token():
    """In a loop of two halves that differ only in their first token (Gemma 3's edit256 answer is one),
    the default drafter continues from a whole period back, where the last 4 tokens would pick the
    other half's occurrence and guess its first token wrong."""
    half = [10, 11, 12, 13, 14, 15, 16]
    context = ([1, *half, 2, *half] * 3)[:-2]  # ... 2 10 11 12 13 14: next comes 15 16 1 10 ...
    proposal = ContextDrafter(256).propose(context, 6)
    assert proposal.branches[0] == [15, 16, 1, 10, 11, 12]


def test_policy_backs_off_longer_after_each_outright_miss():
    """Drafted passes that keep nothing pause drafting for 2, 4, 8 steps; a kept guess ends the backoff."""
    policy = DraftPolicy(PassCosts())
    proposal = Proposal("context/4", [[1, 2]])
    pauses = []
    for _ in range(3):
        policy.record([proposal], [9], drafted=True, accepted=0)
        pauses.append(policy.pause)
        while not policy.ready():
            pass
    assert pauses == [2, 4, 8]
    policy.record([proposal], [1, 2, 3], drafted=True, accepted=2)
    policy.record([proposal], [9], drafted=True, accepted=0)
    assert policy.pause == 2


def test_policy_gates_on_acceptance_against_verify_cost():
    """A source that is rarely right does not draft when rows are expensive; a reliable one drafts
    longer when rows are cheap."""
    good, bad = Proposal("context/4", [list(range(16))]), Proposal("seen/2", [[1]])
    policy = DraftPolicy(PassCosts(beta=0.45))
    for _ in range(10):
        policy.record([good, bad], list(range(6)) + [99], drafted=False, accepted=0)  # good: a = 6/7
    assert policy.choose([bad], room=16) is None
    chosen, rows_dear, spare_dear = policy.choose([good, bad], room=16)
    assert chosen is good and spare_dear == 0
    cheap = DraftPolicy(PassCosts(beta=0.02))
    cheap.score = policy.score
    _, rows_cheap, spare_cheap = cheap.choose([good], room=16)
    assert rows_cheap > rows_dear and spare_cheap > 0


def test_pass_costs_resist_one_slow_pass_and_forget_old_ones():
    """beta is a median, so one pass slowed by another process does not move it; samples expire, so
    a beta measured under a passing load does not stop drafting for good."""
    costs = PassCosts()
    costs.observe(0, 0.005)
    for seconds in (0.0095, 0.0095, 0.5, 0.0095):  # 2 guessed rows: 1.9 steps, once 100 steps
        costs.observe(2, seconds)
    assert costs.beta == pytest.approx(0.45)
    costs.MAX_AGE = 0.0  # as if 20 s had passed
    assert costs.beta == costs.prior


def test_a_pass_costs_the_cpu_time_it_took_not_the_time_it_waited():
    """On the CPU the decoder prices a pass by the CPU time the process spent on it: drafted passes
    that waited (asleep, as behind another process's load) without working do not make rows look dear."""
    cpu_engine = SimpleNamespace(device="cpu", keep=lambda seq, path: None)
    decoder = SpeculativeDecoder(cpu_engine, seen=NgramIndex(64, (2,)), costs=PassCosts())
    seq = SimpleNamespace(cache=SimpleNamespace(length=0))

    def run(choice, work: float, wait: float, n_rows: int) -> None:
        steps = decoder._pass(seq, 1, choice, GreedyPicker(), left=8, stop=(), stats=DraftStats())
        want = next(steps)
        began = time.process_time()
        while time.process_time() - began < work:
            pass
        time.sleep(wait)
        want.logits = one_hot(*[2] * n_rows)
        with pytest.raises(StopIteration):
            steps.send(None)

    run(None, work=0.002, wait=0.0, n_rows=1)  # a plain step: 2 ms of work
    for _ in range(3):
        run((Proposal("context/2", [[2, 2]]), 2, 0), work=0.0, wait=0.1, n_rows=3)  # 2 guessed rows
    assert decoder.costs.beta < 0.2


# -- the cache of kept rows, on the real model --------------------------------------------------------

def _kept_equals_plain(engine: Engine, prefix: list[int], tree: DraftTree, path: list[int]) -> None:
    seq = engine.new_sequence()
    engine.prefill(seq, prefix)
    engine.verify(seq, tree.rows(seq.cache.length))
    engine.keep(seq, path)
    plain = engine.new_sequence()
    engine.prefill(plain, prefix + [tree.tokens[r] for r in path])
    assert seq.tokens == plain.tokens and seq.cache.length == plain.cache.length
    n = plain.cache.length
    assert np.array_equal(seq.cache.positions[:n], plain.cache.positions[:n])
    for layer in plain.cache.k:
        assert np.array_equal(seq.cache.k[layer][:n], plain.cache.k[layer][:n])
        assert np.array_equal(seq.cache.v[layer][:n], plain.cache.v[layer][:n])
    assert np.array_equal(engine.decode(seq, 30), engine.decode(plain, 30))


def test_keep_moves_a_branch_to_where_plain_decoding_writes_it(engine, model):
    """Keeping a tree's second branch (rows that must move down) leaves the cache bit for bit as
    plain decoding of that path leaves it, and the next decode step gives the same logits."""
    prefix = model.tokenize(STORY)
    tree = DraftTree([prefix[-1], 11, 253, 1232, 278], [-1, 0, 0, 2, 3])
    _kept_equals_plain(engine, prefix[:-1], tree, [0, 2, 3])
    _kept_equals_plain(engine, prefix[:-1], tree, [0, 1])  # a prefix: nothing moves


def test_keep_on_the_reference_device():
    """The reference interpreter (not in place) keeps the chosen rows through KVCache.commit the same
    way (the synthetic llama file: the reference runs it in milliseconds)."""
    gguf = open_gguf(synthetic_path("llama"))
    reference = Engine(lower(gguf), GGUFWeights(gguf), n_ctx=16, device="reference")
    tree = DraftTree([54, 11, 35, 82], [-1, 0, 0, 2])
    _kept_equals_plain(reference, [1, 54, 35], tree, [0, 2, 3])


# -- drafted decoding = plain decoding, on the real model --------------------------------------------

def _both(engine: Engine, prompt: list[int], max_tokens: int | None, picker_factory=GreedyPicker,
          stop=frozenset(), beta: float = PassCosts.PRIOR_BETA):
    """Plain and drafted decoding of the same request (no earlier requests in the drafted one's index)."""
    plain = list(plain_decode(engine, engine.new_sequence(), prompt, max_tokens, stop, picker_factory()))
    decoder = SpeculativeDecoder(engine, seen=NgramIndex(1 << 12, (4, 2)), costs=FixedCosts(beta))
    seq = engine.new_sequence()
    drafted = list(decoder.generate(seq, prompt, max_tokens, stop, picker_factory()))
    return plain, drafted, decoder.stats, seq


def test_drafted_greedy_equals_plain_on_repetitive_text(engine, model):
    """Asked to repeat code, drafted greedy decoding gives plain greedy's tokens, with guesses kept."""
    plain, drafted, stats, seq = _both(engine, model.tokenize(REPEAT), 48)
    assert drafted == plain
    assert stats.accepted > 0 and stats.passes < len(plain) - 1
    assert seq.cache.length == len(model.tokenize(REPEAT)) + len(plain) - 1


def test_drafted_greedy_equals_plain_on_a_story(engine, model):
    """On text that does not repeat its prompt, drafted greedy decoding still gives plain's tokens."""
    plain, drafted, _, _ = _both(engine, model.tokenize(STORY), 32)
    assert drafted == plain


def test_drafted_sampling_equals_plain_sampling_with_the_same_seed(engine, model):
    """With the same seed, sampled drafted decoding gives plain sampling's tokens."""
    prompt = model.tokenize(REPEAT)
    plain, drafted, stats, _ = _both(engine, prompt, 40, lambda: InverseCdfPicker(0.7, seed=11))
    assert drafted == plain
    assert stats.drafted > 0


def test_drafted_trees_equal_plain(engine, model):
    """With branching drafts (several continuations verified in one pass, as where extra rows are
    almost free), drafted greedy decoding still gives plain greedy's tokens, also when the kept path
    goes through an alternative branch."""
    prompt = model.tokenize(LOOP)
    plain, drafted, stats, _ = _both(engine, prompt, 40, beta=0.02)
    assert drafted == plain
    assert stats.tree_passes > 0 and stats.branch_hits > 0


@pytest.mark.parametrize("settings", [
    dict(seed=5),  # llama.cpp's default chain: top-k, top-p, min-p, temperature 0.8
    dict(seed=6, temperature=0.5, repeat_penalty=1.1, repeat_last_n=16),  # depends on the history
    dict(seed=7, mirostat=2),  # state (mu) that moves with every accepted token
])
def test_drafted_sampling_with_the_sampler_chain_equals_plain(engine, model, settings):
    """With kinetic's Sampler (penalties and Mirostat included), drafted decoding (trees too) gives
    plain decoding's tokens for the same seed."""
    from kinetic.runtime.sampling import Sampler, SamplingSettings

    prompt = model.tokenize(LOOP)
    plain, drafted, stats, _ = _both(engine, prompt, 40, lambda: Sampler(
        SamplingSettings(**settings), n_vocab=engine.n_vocab, history=prompt), beta=0.02)
    assert drafted == plain
    assert stats.accepted > 0


def test_a_stop_token_ends_drafted_decoding_as_plain(engine, model):
    """A stop token met inside accepted guesses ends generation there, as in plain decoding."""
    prompt = model.tokenize(REPEAT)
    plain = list(plain_decode(engine, engine.new_sequence(), prompt, 40))
    stop = {plain[20]}
    plain_stopped, drafted, _, _ = _both(engine, prompt, 40, stop=stop)
    assert drafted == plain_stopped and drafted[-1] in stop


def test_drafting_never_writes_past_the_context(model):
    """Near the end of a small context, drafts shrink to the room left: no error, plain's tokens."""
    small = Engine(model.engine.graph, model.engine.runner.weights, n_ctx=len(model.tokenize(REPEAT)) + 24)
    plain, drafted, _, seq = _both(small, model.tokenize(REPEAT), None)
    assert drafted == plain and len(plain) == 24 and seq.cache.length == small.n_ctx - 1


def test_earlier_requests_draft_a_repeated_request(engine, model):
    """A request seen before drafts from the shared index and still gives plain's tokens."""
    prompt = model.tokenize(STORY)
    seen = NgramIndex(1 << 12, (4, 2))
    first = list(SpeculativeDecoder(engine, seen=seen, costs=FixedCosts()).generate(engine.new_sequence(), prompt, 24))
    decoder = SpeculativeDecoder(engine, seen=seen, costs=FixedCosts())
    again = list(decoder.generate(engine.new_sequence(), prompt + first[:4], 20))
    assert again == first[4:]
    assert decoder.stats.accepted > 0


@pytest.fixture(scope="module")
def gemma(gemma_path) -> kinetic.Model:
    return kinetic.Model(gemma_path, n_ctx=256)


@pytest.mark.parametrize("picker_factory", [GreedyPicker, lambda: InverseCdfPicker(0.8, seed=5)],
                         ids=["greedy", "sampled"])
def test_drafted_equals_plain_on_gemma(gemma, picker_factory):
    """The identity gate on the second real model (sliding-window attention, GQA 4:1, Q4_K/Q5_0/Q6_K
    kernels): drafted decoding of a repetitive prompt gives plain decoding's tokens, guesses kept."""
    prompt = gemma.tokenize(REPEAT)
    plain, drafted, stats, seq = _both(gemma.engine, prompt, 32, picker_factory)
    assert drafted == plain
    assert stats.drafted > 0
    assert seq.cache.length == len(prompt) + len(plain) - 1


# -- drafted = plain in the numerics modes the default leaves out (tests/conftest.py OTHER_NUMERICS) -


@pytest.mark.parametrize("numerics", OTHER_NUMERICS)
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_drafted_equals_plain_on_real_models_in_every_other_numerics_mode(name, numerics):
    """In each other numerics mode (the fast one's chained block-32 matmuls and f32 attention
    accumulator), drafted greedy decoding with branching drafts and drafted seeded sampling give
    plain decoding's tokens, guesses kept."""
    model = kinetic.Model(model_path(name), n_ctx=256, options=Options(numerics=numerics))
    assert model.options.numerics == numerics
    for picker_factory in (GreedyPicker, lambda: InverseCdfPicker(0.7, seed=11)):
        plain, drafted, stats, _ = _both(model.engine, model.tokenize(LOOP), 32, picker_factory, beta=0.02)
        assert drafted == plain
        assert stats.accepted > 0


@pytest.mark.parametrize("numerics", OTHER_NUMERICS)
@pytest.mark.parametrize("name", NUMERICS_SYNTHETIC)
def test_drafted_equals_plain_on_synthetic_files_in_every_other_numerics_mode(name, numerics):
    """In each other numerics mode, on synthetic files (every block-32 weight type, MoE experts,
    sliding windows), drafted greedy decoding gives plain decoding's tokens, also when a repeated
    request drafts (and keeps) guesses from the earlier one."""
    engine = kinetic.Model(synthetic_path(name), n_ctx=96, options=Options(numerics=numerics), warm_start=False).engine
    prompt = [5, 17, 29, 41, 53, 65, 7, 19]
    plain = list(plain_decode(engine, engine.new_sequence(), prompt, 24, frozenset(), GreedyPicker()))
    seen = NgramIndex(1 << 12, (4, 2))
    first = list(SpeculativeDecoder(engine, seen=seen, costs=FixedCosts()).generate(engine.new_sequence(), prompt, 24))
    assert first == plain
    decoder = SpeculativeDecoder(engine, seen=seen, costs=FixedCosts())
    assert list(decoder.generate(engine.new_sequence(), prompt + plain[:4], 20)) == plain[4:]
    assert decoder.stats.accepted > 0
