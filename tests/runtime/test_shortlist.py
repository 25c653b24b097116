"""Shortlist: the output layer scored through its Q4_0 / Q4_K copy and a proven bound gives the full
layer's tokens and scores bit for bit, and the requests that need every logit take the full layer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import dequantize

from kinetic.codegen.cpu import shortlist_store
from kinetic.codegen.cpu.matmul import quantize_activations
from kinetic.codegen.cpu.shortlist import MORE_FIRST, OutputHead, eligible, lane_scorer
from kinetic.codegen.cpu.shortlist_copy import lane_values, make_copy
from kinetic.codegen.cpu.shortlist_store import copy_key, load_or_make
from kinetic.grammar import GrammarMatcher, TokenVocab, parse_gbnf
from kinetic.ir.rows import PassRows
from kinetic.model import Model
from kinetic.runtime.engine import Engine
from kinetic.runtime.generation import GenerationRequest
from kinetic.runtime.kv_cache import SequenceCaches
from kinetic.runtime.output_layer import FasterOfTwo
from kinetic.runtime.sampling import SamplingSettings
from kinetic.runtime.shortlist import rows_needed
from kinetic.runtime.weights import GGUFWeights
from tests.conftest import load_golden
from tests.runtime.decoding_helpers import greedy_with_scores
from tests.synthetic import synthetic_files, synthetic_path

TEXT = Path(__file__).parents[1] / "data" / "golden" / "apache-2.0.txt"
GOLDEN = {"smollm2": "smollm2-135m", "gemma": "gemma3-270m"}
STEPS = 12  # greedy tokens per golden prompt


# -- the bound, on crafted rows -----------------------------------------------------------------


def q8_rows(values: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Q8_0 bytes u8 [N, K/32*34] from int8 values [N, K] and scales [N, K/32] (stored as f16)."""
    n, k = values.shape
    out = np.empty((n, k // 32, 34), np.uint8)
    out[:, :, :2] = scales.astype(np.float16).reshape(n, k // 32, 1).view(np.uint8)
    out[:, :, 2:] = values.astype(np.int8).reshape(n, k // 32, 32).view(np.uint8)
    return out.reshape(n, -1)


def q8_values(raw: np.ndarray, k: int) -> np.ndarray:
    blocks = raw.reshape(len(raw), k // 32, 34)
    return (blocks[:, :, :2].copy().view(np.float16).astype(np.float64) * blocks[:, :, 2:].view(np.int8)).reshape(-1, k)


def activations(x: np.ndarray) -> np.ndarray:
    """What both kernels read of a hidden row: its q8_0 values, f64 [K]."""
    acts = quantize_activations(x[None], "q8_0")
    return (acts.q.astype(np.float64).reshape(-1, 32) * acts.d.astype(np.float64).reshape(-1, 1)).reshape(-1)


def adversarial_layer(k: int = 256, one_block: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(Q8_0 rows, hidden row): row 1 is random and the hidden row lies along its copy's error (with
    `one_block`, in the one 32-wide block where the copy scores that error highest, zero elsewhere),
    so the copy underrates it by the whole Cauchy-Schwarz bound of that block or row; row 0 is held
    by Q4_0 up to its scale's rounding (its copy scores it right) and scores three quarters of the way
    from row 1's copy score to its true score; rows 2.. repeat row 0, so the decoys fill every row the
    head scores exactly before it applies the bound (the k best-looking and MORE_FIRST more). So row 0
    looks best, row 1 is best, and only the full bound sends row 1 to the exact kernel."""
    rng = np.random.default_rng(0)
    row = q8_rows(rng.integers(-127, 128, (1, k)), np.full((1, k // 32), 2.0**-6))
    error = (q8_values(row, k) - lane_values(make_copy(row, k), k))[0]
    if one_block:
        along = (lane_values(make_copy(row, k), k)[0] * error).reshape(-1, 32).sum(axis=1)
        error[np.arange(k) // 32 != int(np.argmax(along))] = 0.0
    hidden = (3.0 * error).astype(np.float32)
    x = activations(hidden)
    copy_score, true_score = lane_values(make_copy(row, k), k)[0] @ x, q8_values(row, k)[0] @ x
    target = copy_score + 0.75 * (true_score - copy_score)

    # the decoy: q8 = 15 p, p in [-8, 7] along x, one -8 a block (so Q4_0 holds it up to its f16 scale's
    # rounding), its one scale chosen so that it scores the target
    p = np.clip(np.round(7 * x / np.abs(x).max()), -7, 7).reshape(-1, 32)
    p[np.arange(len(p)), np.abs(x.reshape(-1, 32)).argmin(axis=1)] = -8
    scale = np.float16(target / (15 * p.reshape(-1) @ x))
    decoy = q8_rows((15 * p).reshape(1, k), np.full((1, k // 32), scale))
    return np.concatenate([decoy, row, *[decoy] * MORE_FIRST]), hidden


def test_the_bound_is_tight_and_halving_it_loses_the_best_row():
    """The adversarial row's copy error reaches the bound (so no smaller constant would be safe); with
    the full bound the shortlist finds the true best row, with half the bound it would skip it."""
    raw, hidden = adversarial_layer()
    head = OutputHead(raw, "q8_0", 256, threads=1)
    approx, bound = head.bounds(hidden)
    full = head.full(hidden[None])[0]
    gap = abs(float(full[1]) - float(approx[1]))
    assert 0.99 * bound[1] < gap <= bound[1]
    assert int(np.argmax(full)) == 1 and approx[0] > approx[1]
    found = head.shortlist(hidden, 1)
    assert found.ids[np.argmax(found.scores)] == 1 and found.scores[list(found.ids).index(1)] == full[1]
    halved = OutputHead(raw, "q8_0", 256, threads=1, bound_scale=0.5).shortlist(hidden, 1)
    assert 1 not in halved.ids


def test_the_block_bound_is_tight_and_halving_it_loses_the_best_row():
    """With the hidden row along row 1's copy error in one block (zero elsewhere), the block bound is
    reached within 1 % while the row bound is far above it; so the block bound decides: halving the
    per-block bounds alone (the row bounds intact) skips the best row, halving the row bounds alone
    (the per-block bounds intact) still finds it."""
    raw, hidden = adversarial_layer(one_block=True)
    head = OutputHead(raw, "q8_0", 256, threads=1)
    approx, bound = head.bounds(hidden)
    full = head.full(hidden[None])[0]
    gap = abs(float(full[1]) - float(approx[1]))
    assert 0.99 * bound[1] < gap <= bound[1]
    assert head.c[1] * np.linalg.norm(activations(hidden)) > 2 * bound[1]
    assert 1 in head.shortlist(hidden, 1).ids
    head.c = head.c * np.float32(0.5)
    assert 1 in head.shortlist(hidden, 1).ids
    head.c, head.per_block = head.c * np.float32(2), head.per_block * np.float32(0.5)
    assert 1 not in head.shortlist(hidden, 1).ids


def test_the_lane_kernel_variants_score_alike():
    """The lane copy's scorer gives the same scores, bit for bit, on VNNI and without it (exact integer
    block sums, the same float text after them), on a width whose blocks pad to a multiple of 4."""
    rng = np.random.default_rng(3)
    k = 576  # 18 blocks: groups 16 + 4, two of them padding
    raw = q8_rows(rng.integers(-127, 128, (300, k)), rng.uniform(2.0**-10, 1.0, (300, k // 32)))
    head = OutputHead(raw, "q8_0", k, threads=1)
    head._make_copy()
    hidden = rng.standard_normal(k).astype(np.float32)
    acts = quantize_activations(hidden[None], "q8_0")
    host_scores = head._score_lanes(acts)
    head._lanes = lane_scorer(k // 32, "generic")
    assert np.array_equal(head._score_lanes(acts), host_scores)
    exact = lane_values(head.copy, k) @ activations(hidden)
    assert np.allclose(host_scores, exact, rtol=1e-5, atol=1e-4)


def test_copies_are_kept_on_disk_and_reused(tmp_path, monkeypatch):
    """A layer's copy is made once and stored; the next load reads it back equal without making it,
    and another layer (other bytes) gets a copy of its own."""
    rng = np.random.default_rng(4)
    raw = q8_rows(rng.integers(-127, 128, (64, 128)), np.full((64, 4), 2.0**-6))
    made = load_or_make(raw, 128, "q8_0", tmp_path)
    monkeypatch.setattr(shortlist_store, "make_copy", lambda *a: pytest.fail("the copy was made again"))
    again = load_or_make(raw, 128, "q8_0", tmp_path)
    for name in ("rows", "scales", "c", "per_block"):
        assert np.array_equal(getattr(made, name), getattr(again, name))
    other = raw.copy()
    other[0, 5] ^= 1
    assert copy_key(other, 128, "q8_0") != copy_key(raw, 128, "q8_0")


@pytest.mark.parametrize("weight_scale", [2.0**-24, 2.0**-14, 2.0**-6, 1.0, 2.0**10])  # f16 subnormal .. large
@pytest.mark.parametrize("hidden_scale", [1e-5, 1e-2, 1.0, 1e4])  # q8 scales from f16 subnormals to 4e2
def test_the_bound_holds_at_extreme_scales(weight_scale, hidden_scale):
    """For rows of every scale f16 holds (subnormal to large, with rows whose copy rounds badly: values
    far from Q4_0 steps) and hidden rows whose q8 scales span f16's range (the activations' scales are
    f16, so larger rows overflow the full layer itself), the copy's score is within the bound of the
    exact kernel's (and reaches it within 1 % along row 0's copy error, so half the bound would not
    hold), and the shortlist's top 5 (ties included) is the full layer's."""
    rng = np.random.default_rng(1)
    k, n = 128, 512
    values = rng.integers(-127, 128, (n, k))
    values[: n // 4] = np.where(rng.random((n // 4, k)) < 0.5, 127, 119) * rng.choice([-1, 1], (n // 4, k))
    values[n // 2: n // 2 + 8] = values[n // 2]  # eight identical rows: ties
    scales = weight_scale * rng.uniform(0.5, 2.0, (n, k // 32))
    raw = q8_rows(values, scales)
    head = OutputHead(raw, "q8_0", k, threads=1)
    error = q8_values(raw[:1], k)[0] - lane_values(make_copy(raw[:1], k), k)[0]
    for trial in range(5):
        hidden = (hidden_scale * rng.standard_normal(k)).astype(np.float32)
        hidden[trial::17] *= 50.0  # outlier dimensions
        if trial >= 3:  # along the tied rows; along row 0's copy error (the bound is tight there)
            row = q8_values(raw[n // 2: n // 2 + 1], k)[0] if trial == 3 else error
            hidden = (row / np.abs(row).max() * hidden_scale).astype(np.float32)
        approx, bound = head.bounds(hidden)
        full = head.full(hidden[None])[0]
        assert np.all(np.abs(full.astype(np.float64) - approx) <= bound)
        if trial == 4:  # at every scale the bound is reached along the row's error: half of it fails above
            assert abs(float(full[0]) - float(approx[0])) > 0.99 * bound[0]
        found = head.shortlist(hidden, 5)
        assert_same_top(found.ids, found.scores, full, 5)


def random_q6_k_rows(rng: np.random.Generator, n: int, k: int, scale: float) -> np.ndarray:
    """Q6_K bytes u8 [n, k/256*210]: random 6-bit codes and int8 sub-block scales, f16 d near `scale`."""
    blocks = rng.integers(0, 256, (n * (k // 256), 210), dtype=np.uint8)
    blocks[:, 192:208] = rng.integers(-127, 128, (len(blocks), 16)).astype(np.int8).view(np.uint8)
    blocks[:, 208:210] = (scale * rng.uniform(0.5, 2.0, (len(blocks), 1))).astype(np.float16).view(np.uint8)
    return blocks.reshape(n, -1)


@pytest.mark.parametrize("weight_scale", [2.0**-20, 2.0**-8, 1.0])
def test_the_q6_k_bound_holds_and_is_tight(weight_scale):
    """Q6_K rows and their Q4_K copy (q8_k activations, whose scales are f32): the copy's score is
    within the bound for random hidden rows and for one along row 0's copy error, where the bound is
    reached within 1 %; the shortlist's top 5 is the full layer's."""
    from kinetic.codegen.cpu.shortlist_copy import _q4_k_copy, _q6_k_values

    rng = np.random.default_rng(2)
    k = 512
    raw = random_q6_k_rows(rng, 64, k, weight_scale)
    head = OutputHead(raw, "q6_k", k, threads=1)
    copy, _ = _q4_k_copy(raw[:1], k)
    copied = dequantize(copy, Q.Q4_K).astype(np.float64)
    error = _q6_k_values(raw[:1], k)[0] - copied.reshape(-1)
    for hidden in [rng.standard_normal(k).astype(np.float32) * 1e3, (error / np.abs(error).max()).astype(np.float32)]:
        approx, bound = head.bounds(hidden)
        full = head.full(hidden[None])[0]
        assert np.all(np.abs(full.astype(np.float64) - approx) <= bound)
        found = head.shortlist(hidden, 5)
        assert_same_top(found.ids, found.scores, full, 5)
    assert abs(float(full[0]) - float(approx[0])) > 0.99 * bound[0]


def assert_same_top(ids: np.ndarray, scores: np.ndarray, full: np.ndarray, k: int) -> None:
    """The k best of (ids, scores) are the full row's k best, ties by lowest id, with the same scores."""
    assert np.array_equal(scores, full[ids])
    mine = ids[np.lexsort((ids, -scores.astype(np.float64)))][:k]
    theirs = np.lexsort((np.arange(len(full)), -full.astype(np.float64)))[:k]
    assert np.array_equal(mine, theirs)


# -- which requests use it -----------------------------------------------------------------------


@pytest.mark.parametrize(("settings", "expected"), [
    (SamplingSettings(temperature=0.0), 1),
    (SamplingSettings(temperature=0.8), 40),  # llama.cpp's defaults: top-k 40 first
    (SamplingSettings(temperature=0.8, top_k=0), 0),  # top-p without top-k needs every logit
    (SamplingSettings(temperature=0.8, repeat_penalty=1.1), 0),
    (SamplingSettings(temperature=0.0, presence_penalty=-0.5), 0),  # lifts recent tokens
    (SamplingSettings(temperature=0.8, dry_multiplier=0.8), 0),
    (SamplingSettings(temperature=0.8, logit_bias=((5, 1.0),)), 0),
    (SamplingSettings(temperature=0.8, mirostat=2), 0),
    (SamplingSettings(temperature=0.8, top_n_sigma=1.0), 0),  # reads every logit before top-k
    (SamplingSettings(temperature=0.8, samplers=("temperature", "top_k")), 0),  # ties after dividing
    (SamplingSettings(temperature=0.8, top_k=20_000), 0),  # more than an eighth of the vocabulary
])
def test_rows_needed_follows_the_sampler_chain(settings, expected):
    """A request's choice depends on its best 1 or top_k logits only when nothing before top-k can
    lift a token or read every logit; otherwise it takes the whole row (0)."""
    assert rows_needed(settings, n_vocab=49152) == expected


def test_logprobs_and_grammars_take_the_full_layer():
    """Log-probabilities and a grammar's mask need every logit."""
    greedy = SamplingSettings(temperature=0.0)
    assert rows_needed(greedy, logprobs=True, n_vocab=49152) == 0
    assert rows_needed(greedy, grammar=True, n_vocab=49152) == 0


def test_the_measured_choice_tries_both_then_keeps_the_faster_and_explores():
    """The ways take turns until each has run START times; then the one with the lower recent time
    runs, and the other is tried again every EXPLORE calls (so a change of load is followed)."""
    choice = FasterOfTwo()
    picks = []
    for _ in range(2 * FasterOfTwo.EXPLORE):
        way = choice.pick()
        picks.append(way)
        choice.record(way, 1.0 if way else 2.0)  # shortlisting is twice as fast here
    probes = FasterOfTwo.START
    assert picks[:2 * probes] == [True, False] * probes
    slow = [i + 1 for i, way in enumerate(picks) if not way][probes:]
    assert slow and all(call % FasterOfTwo.EXPLORE == 0 for call in slow)


# -- real models ---------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=sorted(GOLDEN))
def pair(request, smollm2_path, gemma_path):
    """(model with Shortlist, an engine on the same weights without it, golden name)."""
    path = smollm2_path if request.param == "smollm2" else gemma_path
    model = Model(path, n_ctx=1024, threads=2)
    assert model.engine.head is not None  # both real models tie a Q8_0 embedding as their output layer
    model.engine.output.adaptive = False  # shortlist every time it may, even where the full layer is cheaper
    plain = Engine(model.graph, GGUFWeights(model.gguf), n_ctx=1024, threads=2, shortlist=False)
    return model, plain, GOLDEN[request.param]


def test_greedy_equals_the_full_layer_on_the_golden_prompts(pair):
    """Greedy decoding through Shortlist gives the full layer's tokens and their scores, bit for bit,
    on every golden raw and chat prompt."""
    model, plain, name = pair
    golden = load_golden(name)
    calls = model.engine.head.calls
    for case in golden["raw"] + golden["chat"]:
        prompt = list(case["prompt_ids"])
        assert greedy_with_scores(model.engine, prompt, STEPS, 1) == greedy_with_scores(plain, prompt, STEPS, 0)
    assert model.engine.head.calls > calls  # the shortlist ran (it was not the full layer all along)


def test_top_k_rows_of_a_text_window_equal_the_full_layer(pair):
    """Every row of a 64-token window of the perplexity text: the shortlist's 40 best tokens and
    their scores are the full layer's, and the full path through the head (on the cut graph's hidden
    rows) and the engine's full-graph pass both equal the graph's logits."""
    model, plain, _ = pair
    tokens = model.tokenize(TEXT.read_text()[:2000], add_special=True, parse_special=False)[:64]
    rows = PassRows.chain(tokens, 0, outputs="all")
    full = plain.forward(rows, {0: plain.new_sequence()}, commit=False)
    assert np.array_equal(model.engine.forward(rows, {0: model.engine.new_sequence()}, commit=False), full)
    engine = model.engine
    hidden = engine.runner.run(engine._run_graph, rows, SequenceCaches({0: engine.new_sequence().cache}))
    assert np.array_equal(engine.head.full(hidden.outputs["hidden"]), full)
    shortlisted = model.engine.forward(rows, {0: model.engine.new_sequence()}, commit=False, top=40)
    for got, want in zip(shortlisted, full, strict=True):
        ids = np.flatnonzero(np.isfinite(got))
        assert_same_top(ids, got[ids], want, 40)


def answer(model: Model, prompt: list[int], **request) -> list[int]:
    events = list(model.generator.generate(GenerationRequest(tuple(prompt), **request)))
    return events[-1].tokens


@pytest.mark.parametrize("draft", [False, True])
def test_seeded_top_k_and_drafted_answers_equal_the_full_layer(pair, draft):
    """Seeded top-k sampling (llama.cpp's default chain) and greedy, drafted or not: the same answer
    with Shortlist as without."""
    model, plain, name = pair
    prompt = list(load_golden(name)["raw"][1]["prompt_ids"])
    without = Model.__new__(Model)
    without.__dict__.update(model.__dict__, engine=plain, _generator=None)
    for settings in (SamplingSettings(temperature=0.8, seed=7), SamplingSettings(temperature=0.0)):
        request = {"settings": settings, "max_tokens": 24, "draft": draft}
        calls = model.engine.head.calls
        assert answer(model, prompt, **request) == answer(without, prompt, **request)
        assert model.engine.head.calls > calls


def test_requests_that_need_every_logit_take_the_full_layer(pair):
    """Penalties, log-probabilities and a grammar: the full layer scores every row (no shortlist call)."""
    model, _, name = pair
    prompt = list(load_golden(name)["raw"][0]["prompt_ids"])
    vocab = TokenVocab.from_tokenizer(model.tokenizer)
    grammar = GrammarMatcher(parse_gbnf('root ::= " " ("yes" | "no") "."\n'), vocab)
    for request in ({"settings": SamplingSettings(temperature=0.0, repeat_penalty=1.2)},
                    {"settings": SamplingSettings(temperature=0.0), "logprobs": True},
                    {"settings": SamplingSettings(temperature=0.0), "grammar": grammar}):
        calls = model.engine.head.calls
        answer(model, prompt, max_tokens=4, draft=False, **request)
        assert model.engine.head.calls == calls


# -- synthetic files -----------------------------------------------------------------------------


def test_every_synthetic_file_with_a_q8_0_or_q6_k_output_layer_gives_the_full_layers_tokens():
    """Each synthetic file whose logits are one Q8_0 or Q6_K matmul: greedy and top-k logits through
    Shortlist equal the full layer's (tokens and scores); the others (another type, a logit scale or a
    softcap) keep it off."""
    served = 0
    for arch in synthetic_files():
        model = Model(synthetic_path(arch), n_ctx=256, threads=2)
        if eligible(model.graph) is None:
            assert model.engine.head is None
            continue
        served += 1
        model.engine.output.adaptive = False
        plain = Engine(model.graph, GGUFWeights(model.gguf), n_ctx=256, threads=2, shortlist=False)
        prompt = [1, 5, 9, 13, 17, 21]
        assert greedy_with_scores(model.engine, prompt, 8, 1) == greedy_with_scores(plain, prompt, 8, 0), arch
        rows = PassRows.chain(prompt, 0, outputs="all")
        full = plain.forward(rows, {0: plain.new_sequence()}, commit=False)
        got = model.engine.forward(rows, {0: model.engine.new_sequence()}, commit=False, top=5)
        for row, want in zip(got, full, strict=True):
            ids = np.flatnonzero(np.isfinite(row))
            assert_same_top(ids, row[ids], want, 5)
    assert served >= 20
