"""RAD-1 on real models: drafted decoding gives plain decoding's tokens (greedy, seeded sampling and
the sampler chain, in every numerics mode), and keeping a verified tree's accepted rows leaves the
cache bit for bit as plain decoding writes it. The acceptance rule on hand-made logits is in
test_speculative_acceptance.py, the drafters and the policy in test_speculative_drafters.py."""

from __future__ import annotations

import numpy as np
import pytest

import kinetic
from kinetic.frontend.blocks import Options
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.lower import lower
from kinetic.runtime.drafting import DraftTree, NgramIndex, PassCosts
from kinetic.runtime.engine import Engine
from kinetic.runtime.speculative import GreedyPicker, SpeculativeDecoder, plain_decode
from kinetic.runtime.weights import GGUFWeights
from tests.conftest import NUMERICS_SYNTHETIC, OTHER_NUMERICS, model_path
from tests.device_checks import FixedCosts
from tests.runtime.speculative_helpers import InverseCdfPicker
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


@pytest.fixture(scope="module")
def model(smollm2_path) -> kinetic.Model:
    return kinetic.Model(smollm2_path, n_ctx=512)


@pytest.fixture(scope="module")
def engine(model) -> Engine:
    return model.engine


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
