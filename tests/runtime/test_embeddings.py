"""Embedding models (kinetic/runtime/embedding.py, kinetic/frontend/encoder.py): every embedding file's
token embeddings, pooled vectors and rank scores match llama.cpp's; several inputs in shared passes
each get the bits they get alone; every device gives the reference interpreter's bits; inputs longer
than the context are refused or truncated."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import kinetic
from kinetic import devices
from kinetic.errors import KineticError
from kinetic.runtime.embedding import ContextExceeded, normalize
from tests.conftest import GGML_OPTIONS
from tests.synthetic import SYNTHETIC, synthetic_files, synthetic_path

FILES = synthetic_files(embeddings=True)
DEVICES = ("cpu", "cuda-emulated", "vulkan")


@functools.cache
def _model(name: str, device: str = "cpu") -> kinetic.Model:
    """In ggml's numerics mode whatever the default: the expected values are llama.cpp's, and every
    device (CUDA and Vulkan follow ggml's orders only) then runs the graph the CPU runs."""
    return kinetic.Model(synthetic_path(name), n_ctx=64, device=device, threads=1, warm_start=False,
                         options=GGML_OPTIONS)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.atleast_2d(a).astype(np.float64), np.atleast_2d(b).astype(np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def _inputs(name: str) -> list[list[int]]:
    """Inputs of several lengths: both prompts, their prefixes, one token."""
    ref = np.load(SYNTHETIC / name / f"{name}.npz")
    p0, p1 = ref["p0_ids"].tolist(), ref["p1_ids"].tolist()
    return [p0, p1[:5], p1, p0[:1], p0[3:11]]


def test_every_embedding_file_is_tested():
    """The files: bert and nomic-bert (mean), CLS, last-token, a reranker, a decoder embedder and a
    decoder reranker."""
    poolings = {_model(name).embedder.pooling for name in FILES}
    assert {"bert", "nomic-bert", "bert-cls", "bert-rank", "nomic-bert-last", "qwen3-embed",
            "qwen3-rerank"} <= set(FILES)
    assert poolings == {"mean", "cls", "last", "rank"}


@pytest.mark.parametrize("name", FILES)
def test_embeddings_match_llama_cpp(name):
    """Every token's hidden state (pooling none) and the file's pooled vector (or rank score) are
    llama.cpp's: cosine >= 0.9999 (max |difference| measured: 4.8e-7 on the encoders, 0.019 on one
    token of qwen3-rerank, where llama.cpp's batched matmuls round otherwise; docs/embeddings.md)."""
    ref = np.load(SYNTHETIC / name / f"{name}.npz")
    embedder = _model(name).embedder
    for prompt in ("p0", "p1"):
        ids = ref[f"{prompt}_ids"].tolist()
        tokens = embedder.hidden_states([ids])[0]
        want = ref[f"{prompt}_token_embeddings"]
        assert _cosines(tokens, want).min() >= 0.9999
        assert np.abs(tokens - want).max() < 0.05
        if f"{prompt}_rank_scores" in ref:
            assert abs(embedder.scores([ids])[0] - ref[f"{prompt}_rank_scores"][0]) < 1e-5
            continue
        pooled = embedder.embed([ids], normalized=False)[0]
        assert _cosines(pooled, ref[f"{prompt}_pooled_embedding"])[0] >= 0.9999
        assert np.abs(pooled - ref[f"{prompt}_pooled_embedding"]).max() < 1e-5


@pytest.mark.parametrize("name", FILES)
def test_shared_passes_give_each_input_its_vector_alone(name):
    """Five inputs of different lengths embedded together (in shared passes) give each the bits it
    gets embedded alone: its hidden states, and its pooled vector."""
    embedder = _model(name).embedder
    inputs = _inputs(name)
    before = embedder.passes
    together = embedder.hidden_states(inputs)
    assert embedder.passes - before < len(inputs)  # inputs did share passes
    for ids, states in zip(inputs, together, strict=True):
        alone = embedder.hidden_states([ids])[0]
        assert np.array_equal(states.view(np.uint32), alone.view(np.uint32))
    pooled = embedder.embed(inputs) if embedder.pooling != "rank" else []
    for ids, vector in zip(inputs, pooled, strict=False):
        assert np.array_equal(vector, embedder.embed([ids])[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FILES)
def test_device_gives_the_reference_bits(name, device):
    """On each device, shared passes of several inputs give the reference interpreter's hidden states
    bit for bit, and an input alone on the device gives what it gets among the others (a device
    without a kernel for an op of the file is skipped, naming it)."""
    graph = _model(name).graph
    d = devices.DEVICES[device]
    reason = d.unavailable() or d.unsupported(graph)
    if reason:
        pytest.skip(f"{device}: {reason}")
    inputs = _inputs(name)
    ours = _model(name, device).embedder.hidden_states(inputs)
    reference = _model(name, "reference").embedder.hidden_states(inputs)
    for a, b in zip(ours, reference, strict=True):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    alone = _model(name, device).embedder.hidden_states([inputs[1]])[0]
    assert np.array_equal(alone.view(np.uint32), ours[1].view(np.uint32))


def test_model_embed_normalizes_and_takes_each_input_form():
    """Model.embed: one string gives one row; a list of strings, token ids and lists of ids each give a
    row per input; normalize=True gives unit vectors (llama.cpp's common_embd_normalize), False the raw
    pooled vectors."""
    model = _model("bert")
    texts = ["The quick brown fox", "def add(a, b):"]
    raw = model.embed(texts, normalize=False)
    unit = model.embed(texts)
    assert unit.shape == (2, 256) and raw.shape == (2, 256)
    assert np.allclose(np.linalg.norm(unit, axis=1), 1, atol=1e-6)
    assert np.array_equal(unit, normalize(raw))
    assert np.array_equal(model.embed(texts[0]), unit[:1])
    ids = model.tokenize(texts[0])
    assert np.array_equal(model.embed(ids), unit[:1])
    assert np.array_equal(model.embed([ids, model.tokenize(texts[1])]), unit)


def test_too_long_input_is_refused_naming_the_limit_or_truncated():
    """bert-cls has learned positions for 64 tokens: a longer input is refused with the limit named,
    and with truncate=True it is cut to 64 tokens (the vector of its first 64)."""
    model = _model("bert-cls")
    ids = list(range(5, 75))
    with pytest.raises(ContextExceeded, match="70 tokens, more than the context of 64"):
        model.embed([ids])
    assert np.array_equal(model.embed([ids], truncate=True), model.embed([ids[:64]]))


def test_rerank_scores_each_document_with_the_classification_head():
    """Model.rerank gives one score per document, in order, each the head's score of the pair prompt
    alone; a model without a classification head refuses to rank."""
    model = _model("bert-rank")
    docs = ["The quick brown fox", "jumps over", "def add(a, b):"]
    scores = model.rerank("a fox", docs)
    assert len(scores) == 3 and len(set(scores)) == 3
    assert scores[1] == model.rerank("a fox", [docs[1]])[0]
    with pytest.raises(KineticError, match="no classification head"):
        _model("bert").embedder.scores([[1, 2, 3]])


def test_a_text_model_is_not_an_embedding_model():
    """Model.embed on a generative model is refused, saying what to use."""
    with pytest.raises(KineticError, match="not an embedding model"):
        kinetic.Model(synthetic_path("llama"), n_ctx=64, warm_start=False).embed("hello")


def test_a_decoder_reranker_scores_its_last_token_softmaxed():
    """qwen3-rerank (Qwen3-Reranker style): the score is the softmax of cls.output's two rows over the
    last token, llama.cpp's to 1e-6, and between 0 and 1."""
    ref = np.load(SYNTHETIC / "qwen3-rerank" / "qwen3-rerank.npz")
    embedder = _model("qwen3-rerank").embedder
    assert embedder.causal
    for prompt in ("p0", "p1"):
        score = embedder.scores([ref[f"{prompt}_ids"].tolist()])[0]
        assert abs(score - ref[f"{prompt}_rank_scores"][0]) < 1e-6 and 0 < score < 1
