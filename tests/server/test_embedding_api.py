"""The embedding and rerank routes (kinetic/server/embedding_api.py) with the real client packages: the
openai package's embeddings.create (float and base64, strings and token ids), the ollama package's
embed, LangChain's OpenAIEmbeddings, llama-server's /embedding and /rerank shapes; each answer is
Model.embed's (Model.rerank's) bits; what a model cannot do is refused, naming it."""

from __future__ import annotations

import base64
import functools

import httpx
import numpy as np
import pytest

import kinetic
from tests.server.live import serving
from tests.synthetic import synthetic_path

TEXTS = ["The quick brown fox jumps over the lazy dog.", "def add(a, b): return a + b", "hello"]


@functools.cache
def _model(name: str, pooling: str | None = None) -> kinetic.Model:
    return kinetic.Model(synthetic_path(name), n_ctx=64, threads=1, warm_start=False, pooling=pooling)


@pytest.fixture(scope="module")
def url():
    with serving(_model("nomic-bert")) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_openai_embeddings_float_and_base64_are_model_embed(client):
    """embeddings.create gives Model.embed's normalized vectors, in order: as floats, and as base64 of
    little-endian float32 (the bits themselves); token-id inputs give the vectors of their texts."""
    want = _model("nomic-bert").embed(TEXTS)
    floats = client.embeddings.create(model="nomic", input=TEXTS, encoding_format="float")
    assert [d.index for d in floats.data] == [0, 1, 2]
    assert np.array_equal(np.array([d.embedding for d in floats.data], np.float32), want)
    packed = client.embeddings.create(model="nomic", input=TEXTS, encoding_format="base64")
    got = np.stack([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in packed.data])
    assert np.array_equal(got, want)
    ids = [_model("nomic-bert").tokenize(t) for t in TEXTS[:2]]
    by_ids = client.embeddings.create(model="nomic", input=ids, encoding_format="float")
    assert np.array_equal(np.array([d.embedding for d in by_ids.data], np.float32), want[:2])
    assert floats.usage.prompt_tokens == sum(len(_model("nomic-bert").tokenize(t)) for t in TEXTS)


def test_openai_refusals_name_the_limit_and_the_field(client):
    """dimensions other than the width is refused naming it; an input longer than the context is
    refused with OpenAI's context_length_exceeded and the limit."""
    import openai

    with pytest.raises(openai.BadRequestError, match="dimensions 64 is not supported"):
        client.embeddings.create(model="nomic", input="hello", dimensions=64)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 64") as err:
        client.embeddings.create(model="nomic", input=[list(range(5, 80))])
    assert err.value.code == "context_length_exceeded"


def test_ollama_embed_and_legacy_embeddings(url):
    """The ollama package's embed gives the normalized vectors and truncates a long input by default
    (truncate=False refuses it); /api/embeddings gives the raw pooled vector of its prompt."""
    import ollama

    c = ollama.Client(host=url)
    model = _model("nomic-bert")
    reply = c.embed(model="nomic", input=TEXTS)
    assert np.array_equal(np.array(reply.embeddings, np.float32), model.embed(TEXTS))
    long_text = " ".join(["word"] * 120)
    assert np.array_equal(np.array(c.embed(model="nomic", input=long_text).embeddings, np.float32),
                          model.embed(long_text, truncate=True))
    with pytest.raises(ollama.ResponseError, match="context"):
        c.embed(model="nomic", input=long_text, truncate=False)
    legacy = c.embeddings(model="nomic", prompt=TEXTS[0])
    assert np.array_equal(np.array(legacy.embedding, np.float32), model.embed(TEXTS[0], normalize=False)[0])


def test_langchain_openai_embeddings(url):
    """LangChain's OpenAIEmbeddings pointed at the server embeds documents and a query as Model.embed."""
    from langchain_openai import OpenAIEmbeddings

    lc = OpenAIEmbeddings(model="nomic", base_url=url + "/v1", api_key="unused", check_embedding_ctx_length=False,
                          max_retries=0)
    want = _model("nomic-bert").embed(TEXTS)
    assert np.allclose(np.array(lc.embed_documents(TEXTS), np.float32), want, atol=0)
    assert np.array_equal(np.array(lc.embed_query(TEXTS[2]), np.float32), want[2])


def test_llama_server_embedding_shapes(url):
    """/embedding answers [{index, embedding: [[pooled]]}] (normalized unless embd_normalize -1), for a
    string or a list of them; generation routes are refused on an embedding model."""
    model = _model("nomic-bert")
    reply = httpx.post(url + "/embedding", json={"content": TEXTS[:2]}, timeout=60).json()
    assert [r["index"] for r in reply] == [0, 1]
    assert np.array_equal(np.array([r["embedding"][0] for r in reply], np.float32), model.embed(TEXTS[:2]))
    raw = httpx.post(url + "/embeddings", json={"content": TEXTS[0], "embd_normalize": -1}, timeout=60).json()
    assert np.array_equal(np.array(raw[0]["embedding"][0], np.float32), model.embed(TEXTS[0], normalize=False)[0])
    refused = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert refused.status_code == 501 and "embedding model" in refused.json()["error"]["message"]


def test_pooling_none_gives_every_token():
    """Under --pooling none /embedding answers one vector per token (unnormalized, as llama-server), and
    the OpenAI route refuses it as not OpenAI compatible."""
    model = _model("bert", pooling="none")
    with serving(model) as base:
        reply = httpx.post(base + "/embedding", json={"content": TEXTS[2]}, timeout=60).json()
        per_token = np.array(reply[0]["embedding"], np.float32)
        assert per_token.shape == (len(model.tokenize(TEXTS[2])), 256)
        assert np.array_equal(per_token, model.embed(TEXTS[2], normalize=False)[0])
        refused = httpx.post(base + "/v1/embeddings", json={"input": "hi"})
        assert refused.status_code == 400 and "not OpenAI compatible" in refused.json()["error"]["message"]


def test_rerank_in_llama_server_jina_and_tei_shapes():
    """/v1/rerank answers results sorted by relevance_score, top_n of them, with the documents when
    asked (Jina/Cohere); `texts` gets TEI's list of {index, score}; the scores are Model.rerank's; an
    embedding model without --reranking refuses /rerank."""
    model = _model("bert-rank")
    docs = ["a fox in the river", "numbers and sums", "the lazy dog"]
    scores = model.rerank("where is the fox?", docs)
    order = sorted(range(3), key=lambda i: -scores[i])
    with serving(model) as base:
        body = httpx.post(base + "/v1/rerank", json={"query": "where is the fox?", "documents": docs, "top_n": 2,
                                                      "return_documents": True}, timeout=60).json()
        assert [r["index"] for r in body["results"]] == order[:2]
        assert [r["relevance_score"] for r in body["results"]] == [scores[i] for i in order[:2]]
        assert body["results"][0]["document"]["text"] == docs[order[0]]
        tei = httpx.post(base + "/rerank", json={"query": "where is the fox?", "texts": docs}, timeout=60).json()
        assert [(r["index"], r["score"]) for r in tei] == [(i, scores[i]) for i in order]
    with serving(_model("bert")) as base:
        refused = httpx.post(base + "/rerank", json={"query": "q", "documents": ["d"]})
        assert refused.status_code == 501 and "--reranking" in refused.text


def test_serve_embedding_refuses_a_text_model():
    """`kinetic serve MODEL --embedding` on a text model stops at start, saying it needs an embedding model."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "kinetic.cli.main", "serve", str(synthetic_path("llama")),
                           "--embedding", "--port", "0", "-c", "64"], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "--embedding needs an embedding model; llama.gguf is a text model" in done.stderr
