"""Embeddings and reranking over HTTP, in the three APIs' shapes: OpenAI's /v1/embeddings,
llama-server's /embedding, /embeddings and /rerank (/v1/rerank, /reranking, /v1/reranking; its Jina /
Cohere shape, and TEI's when the body has `texts`), Ollama's /api/embed and /api/embeddings.

Owns: reading each API's fields (OpenAI `input`: a string, strings, token ids or lists of token ids,
`encoding_format` float or base64, `dimensions` refused unless it is the model's width; llama-server
`content` and `embd_normalize`; Ollama `input`/`prompt` and `truncate`), the answers' shapes (read from
llama.cpp's tools/server and Ollama's API docs), refusing an input longer than the context with the
limit named (Ollama truncates unless truncate is false, as Ollama does), and, for an embedding model,
refusing the generation routes (as llama-server started with --embedding does). Does not own
passes, pooling or normalization (kinetic/runtime/embedding.py, reached through the Model).
The work runs on the CpuPool's threads (tokenizing and the passes; the embedder takes one caller at a
time), never on the event loop.
"""

from __future__ import annotations

import base64
import time

import numpy as np
from litestar import Request, Response, post

from kinetic.embeddings import inputs_to_ids, rerank_ids
from kinetic.errors import KineticError
from kinetic.runtime.embedding import ContextExceeded as TooLong
from kinetic.runtime.embedding import is_embedding_graph
from kinetic.server.body import Fields
from kinetic.server.common import json_response, prepared, state_of
from kinetic.server.errors import ApiError, ContextExceeded, error_response, path_of
from kinetic.server.options import ServerState

GENERATION_PATHS = frozenset({"/completion", "/completions", "/v1/completions", "/v1/chat/completions",
                              "/chat/completions", "/infill", "/api/generate", "/api/chat", "/v1/messages",
                              "/v1/responses", "/v1/prefill"})


def _embedder(state: ServerState, *, rank: bool = False):
    model = state.model
    if not is_embedding_graph(model.graph):
        what = "a reranking" if rank else "an embedding"
        raise ApiError(400, f"{state.name} is a text model, not {what} model: use the chat or completion routes")
    embedder = model.embedder
    if rank and embedder.pooling != "rank":
        raise ApiError(501, "This server does not support reranking. Start it with `--reranking` and a reranker "
                            "model", kind="not_supported_error")
    return embedder


def _inputs(state: ServerState, f: Fields, name: str, *, truncate: bool) -> list[list[int]]:
    """`name` as a list of inputs: a string, a list of strings, a list of token ids (one input) or a
    list of token-id lists; each as token ids."""
    value = f.raw(name)
    if isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(t, int) for t in value)):
        value = [value]
    if not isinstance(value, list) or not value:
        raise f.bad(name, "a string, a list of strings, a list of token ids or a list of token-id lists")
    embedder = _embedder(state)
    try:
        return inputs_to_ids(state.model.tokenizer, value, n_vocab=state.model.tokenizer.vocab_size,
                             limit=embedder.max_tokens, truncate=truncate)
    except KineticError as e:
        raise ApiError(400, e.message, param=name) from None


def _embed(state: ServerState, ids: list[list[int]], *, normalized: bool) -> list[np.ndarray]:
    try:
        return state.model.embedder.embed(ids, normalized=normalized)
    except TooLong as e:
        raise ContextExceeded(e.n_tokens, e.limit) from None
    except KineticError as e:
        raise ApiError(400, e.message) from None


def _check_dimensions(state: ServerState, f: Fields, width: int) -> None:
    wanted = f.integer("dimensions", 1)
    if wanted is not None and wanted != width:
        raise ApiError(400, f"dimensions {wanted} is not supported: {state.name} gives vectors of {width} values "
                            "and cannot shorten them (it is not a Matryoshka model); leave dimensions out",
                       param="dimensions")


# -- OpenAI ---------------------------------------------------------------------------------------------


def _openai(state: ServerState, f: Fields) -> Response:
    fmt = f.string("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise f.bad("encoding_format", '"float" or "base64"')
    ids = _inputs(state, f, "input", truncate=False)
    if state.model.embedder.pooling in ("none", "rank"):
        raise ApiError(400, f"Pooling type '{state.model.embedder.pooling}' is not OpenAI compatible: start the "
                            "server with --pooling mean, cls or last, or use /embedding")
    vectors = _embed(state, ids, normalized=True)
    _check_dimensions(state, f, int(vectors[0].shape[-1]))
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" else v.tolist()}
            for i, v in enumerate(vectors)]
    n = sum(len(x) for x in ids)
    return json_response({"object": "list", "data": data, "model": f.string("model") or state.name,
                          "usage": {"prompt_tokens": n, "total_tokens": n}})


@post(["/v1/embeddings"], status_code=200)
async def openai_embeddings(request: Request) -> Response:
    state = state_of(request)
    return await prepared(request, lambda f, _: _openai(state, f))


# -- llama-server ----------------------------------------------------------------------------------------


def _llama(state: ServerState, f: Fields) -> Response:
    name = "content" if f.has("content") else "input"
    ids = _inputs(state, f, name, truncate=False)
    norm = f.integer("embd_normalize")
    if norm not in (None, -1, 2):
        raise ApiError(400, f"embd_normalize {norm} is not supported: use 2 (euclidean, the default) or -1 (none)",
                       param="embd_normalize")
    pooling = state.model.embedder.pooling
    vectors = _embed(state, ids, normalized=norm != -1 and pooling != "none")
    rows = [v.tolist() if pooling == "none" else [v.tolist()] for v in vectors]  # per token, or the one pooled
    return json_response([{"index": i, "embedding": r} for i, r in enumerate(rows)])


@post(["/embedding", "/embeddings"], status_code=200)
async def llama_embeddings(request: Request) -> Response:
    state = state_of(request)
    return await prepared(request, lambda f, _: _llama(state, f))


def _rerank(state: ServerState, f: Fields) -> Response:
    embedder = _embedder(state, rank=True)
    query = f.raw("query")
    if not isinstance(query, str):
        raise ApiError(400, '"query" must be provided as a string', param="query")
    tei = f.has("texts")
    documents = f.raw("texts" if tei else "documents")
    if not isinstance(documents, list) or not documents:
        raise ApiError(400, '"documents" must be a non-empty string array', param="documents")
    texts = [d if isinstance(d, str) else d.get("text") if isinstance(d, dict) else None for d in documents]
    if not all(isinstance(t, str) for t in texts):
        raise ApiError(400, '"documents" must be a non-empty string array', param="documents")
    top_n = f.integer("top_n", 1) or len(texts)
    pairs = [rerank_ids(state.model.tokenizer, state.model.gguf, query, t) for t in texts]
    try:
        scores = embedder.scores(pairs)
    except TooLong as e:
        raise ContextExceeded(e.n_tokens, e.limit) from None
    label = "score" if tei else "relevance_score"
    with_text = f.boolean("return_text" if tei else "return_documents", False)
    results = []
    for i, score in sorted(enumerate(scores), key=lambda p: -p[1])[:top_n]:
        item = {"index": i, label: score}
        if with_text:
            item.update({"text": texts[i]} if tei else {"document": {"text": texts[i]}})
        results.append(item)
    if tei:
        return json_response(results)
    n = sum(len(p) for p in pairs)
    return json_response({"model": f.string("model") or state.name, "object": "list",
                          "usage": {"prompt_tokens": n, "total_tokens": n}, "results": results})


@post(["/rerank", "/v1/rerank", "/reranking", "/v1/reranking"], status_code=200)
async def rerank(request: Request) -> Response:
    state = state_of(request)
    return await prepared(request, lambda f, _: _rerank(state, f))


# -- Ollama ----------------------------------------------------------------------------------------------


def _ollama(state: ServerState, f: Fields, *, legacy: bool) -> Response:
    start = time.perf_counter()
    truncate = bool(f.boolean("truncate", True))
    ids = _inputs(state, f, "prompt" if legacy else "input", truncate=truncate)
    if state.model.embedder.pooling in ("none", "rank"):
        raise ApiError(400, f"this model's pooling is {state.model.embedder.pooling}: start the server with "
                            "--pooling mean, cls or last")
    vectors = _embed(state, ids, normalized=not legacy)  # Ollama's /api/embeddings answers the raw vector
    _check_dimensions(state, f, int(vectors[0].shape[-1]))
    if legacy:
        return json_response({"embedding": vectors[0].tolist()})
    took = int((time.perf_counter() - start) * 1e9)
    return json_response({"model": f.string("model") or state.name, "embeddings": [v.tolist() for v in vectors],
                          "total_duration": took, "load_duration": 0,
                          "prompt_eval_count": sum(len(x) for x in ids)})


@post(["/api/embed"], status_code=200)
async def ollama_embed(request: Request) -> Response:
    state = state_of(request)
    return await prepared(request, lambda f, _: _ollama(state, f, legacy=False))


@post(["/api/embeddings"], status_code=200)
async def ollama_embeddings(request: Request) -> Response:
    state = state_of(request)
    return await prepared(request, lambda f, _: _ollama(state, f, legacy=True))


async def refuse_generation(request: Request) -> Response | None:
    """Before each request: an embedding model answers no generation route (llama-server --embedding)."""
    if path_of(request) in GENERATION_PATHS and is_embedding_graph(state_of(request).model.graph):
        return error_response(path_of(request), 501, f"{state_of(request).name} is an embedding model: use "
                              "/v1/embeddings, /embedding, /api/embed or /rerank")
    return None


ROUTES = [openai_embeddings, llama_embeddings, rerank, ollama_embed, ollama_embeddings]
