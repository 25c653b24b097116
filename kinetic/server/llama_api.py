"""llama-server's own API: /completion, /tokenize, /detokenize, /apply-template, /props, /slots, /health,
/metrics.

Owns: llama-server's field names, defaults (/tokenize: add_special false, parse_special true) and
response shapes, read from llama.cpp's tools/server so its clients parse ours unchanged. These
routes take bodies of any content type, as llama-server does. grammar (GBNF) or json_schema holds
/completion's answer (constraints.py); cache_prompt, id_slot and the sampler fields Kinetic has no
sampler for are accepted and ignored (the scheduler picks the slot; the answer's id_slot names it).
"""

from __future__ import annotations

from dataclasses import dataclass

from litestar import Request, Response, get, post
from litestar.response import Stream

from kinetic import __version__
from kinetic.server.body import Fields
from kinetic.server.common import (
    SSE_HEADERS,
    guarded,
    json_response,
    prepared,
    sse,
    state_of,
    timings,
    token_text,
    whole_answer,
)
from kinetic.server.constraints import compile_grammar, llama_grammar
from kinetic.server.errors import ApiError, error_body, not_supported, path_of
from kinetic.server.metrics import prometheus_text
from kinetic.server.openai_api import prepare_chat
from kinetic.server.options import ServerState
from kinetic.server.params import sampling_settings
from kinetic.server.prompts import check_ids, tokenize
from kinetic.server.worker import Failed, Finished, GenerationRequest, Piece, TokenInfo


@dataclass(frozen=True)
class _Prepared:
    generation: GenerationRequest
    stream: bool
    return_tokens: bool
    prompt_text: str


def _prepare_completion(state: ServerState, f: Fields) -> _Prepared:
    spec = llama_grammar(f)
    if f.boolean("post_sampling_probs", False):
        raise not_supported("post_sampling_probs")
    n_predict = f.integer("n_predict")
    if n_predict is None:
        n_predict = f.integer("max_tokens")
    n_probs = f.integer("n_probs", 0, 100) or 0
    stream = bool(f.boolean("stream", False))
    return_tokens = bool(f.boolean("return_tokens", False))
    settings = sampling_settings(f, state.defaults, state.model.n_vocab)
    ids = _prompt_ids(state, f)
    grammar = compile_grammar(state.worker.grammars, spec)
    generation = GenerationRequest(ids, settings, None if n_predict is None or n_predict < 0 else n_predict,
                                   f.strings("stop"), n_probs > 0, n_probs, bool(f.boolean("ignore_eos", False)),
                                   grammar=grammar)
    return _Prepared(generation, stream, return_tokens, state.model.detokenize(list(ids)))


@post(["/completion", "/completions"], status_code=200)
async def completion(request: Request) -> Response:
    state = state_of(request)
    ready = await prepared(request, lambda f, _: _prepare_completion(state, f))
    req = ready.generation
    job = state.worker.submit(req)
    params = _params(req, ready.stream)
    probs = req.top_logprobs > 0
    if ready.stream:
        events = _stream(job, state, params, ready.prompt_text, probs, path_of(request))
        return Stream(guarded(events, path_of(request), sse), media_type="text/event-stream", headers=SSE_HEADERS)
    text, tokens, fin = await whole_answer(job, request)
    body = _final(state, fin, params, ready.prompt_text, text, fin.tokens if ready.return_tokens else [],
                  slot=job.ticket.slot)
    if probs:
        body["completion_probabilities"] = [_probs(t) for t in tokens]
    return Response(body)


def _prompt_ids(state: ServerState, f: Fields) -> tuple[int, ...]:
    """prompt: text, token ids, or a list mixing both (llama-server's tokenize_mixed); a list holding
    one of those counts as that prompt. Refused before tokenizing when its texts' bytes cannot fit."""
    prompt = f.raw("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise f.bad("prompt", "a string, a list of token ids, or a list mixing both")
    fewest = 0
    for part in prompt:
        if isinstance(part, list):
            raise ApiError(400, "prompt: one prompt per request is supported (a list of several is not yet)",
                           "prompt")
        if isinstance(part, bool) or not isinstance(part, (str, int)):
            raise f.bad("prompt", "a string, a list of token ids, or a list mixing both")
        fewest += state.token_bound.fewest_tokens(part) if isinstance(part, str) else 1
    state.token_bound.refuse_oversized(fewest, state.n_ctx)
    ids: list[int] = []
    for i, part in enumerate(prompt):
        ids += tokenize(state, part, add_special=i == 0) if isinstance(part, str) else [part]
    return check_ids(state, ids)


def _params(req: GenerationRequest, stream: bool) -> dict:
    n_predict = -1 if req.max_tokens is None else req.max_tokens
    return {**req.settings.as_dict(), "n_predict": n_predict, "max_tokens": n_predict, "stream": stream,
            "n_probs": req.top_logprobs, "ignore_eos": req.ignore_eos, "stop": list(req.stop)}


def _final(state: ServerState, fin: Finished, params: dict, prompt: str, text: str, tokens: list[int],
           *, slot: int) -> dict:
    """The answer's last message; `slot`: the slot that ran it (its id in /slots), as llama-server."""
    return {"index": 0, "content": text, "tokens": tokens, "id_slot": slot, "stop": True, "model": state.name,
            "tokens_predicted": fin.generated_tokens, "tokens_evaluated": fin.prompt_tokens,
            "generation_settings": {**params, "seed": fin.settings.seed}, "prompt": prompt,
            "has_new_line": "\n" in text, "truncated": False, "stop_type": fin.stop_type,
            "stopping_word": fin.stopping_word, "tokens_cached": fin.prompt_tokens + fin.generated_tokens,
            "timings": timings(fin)}


def _probs(t: TokenInfo) -> dict:
    return {"id": t.id, "token": token_text(t.piece), "bytes": list(t.piece), "logprob": t.logprob,
            "top_logprobs": [{"id": i, "token": token_text(p), "bytes": list(p), "logprob": lp} for i, p, lp in t.top]}


async def _stream(job, state: ServerState, params: dict, prompt: str, probs: bool, path: str):
    decoded = 0
    n_prompt = len(job.request.prompt)
    async for event in job.events():
        if isinstance(event, Piece):
            decoded += len(event.tokens)
            if not event.text and not event.tokens:
                continue
            chunk = {"index": 0, "content": event.text, "tokens": [t.id for t in event.tokens], "stop": False,
                     "id_slot": job.ticket.slot, "tokens_predicted": decoded, "tokens_evaluated": n_prompt}
            if probs:
                chunk["completion_probabilities"] = [_probs(t) for t in event.tokens]
            yield sse(chunk)
        elif isinstance(event, Failed):
            yield sse(error_body(path, event.status, event.message))
            return
        else:
            yield sse(_final(state, event, params, prompt, "", [], slot=job.ticket.slot))


def _tokenized(state: ServerState, f: Fields) -> Response:
    content = f.raw("content")
    if content is None:
        return Response({"tokens": []})
    if not isinstance(content, str):
        raise f.bad("content", "a string")
    add_special = f.boolean("add_special", False)
    parse_special = f.boolean("parse_special", True)
    with_pieces = f.boolean("with_pieces", False)
    tokenizer = state.model.tokenizer
    ids = tokenizer.encode(content, add_special=add_special, parse_special=parse_special)
    if not with_pieces:
        return json_response({"tokens": ids})
    return json_response({"tokens": [{"id": t, "piece": _piece(tokenizer.piece(t))} for t in ids]})


@post(["/tokenize"], status_code=200)
async def tokenize_route(request: Request) -> Response:
    """llama-server's /tokenize: no context limit (the body limit bounds it); tokenized, and its
    answer encoded, on the CpuPool."""
    state = state_of(request)
    return await prepared(request, lambda f, _: _tokenized(state, f))


def _piece(piece: bytes):
    """The piece as text, or as its byte values when it is not valid UTF-8 on its own (llama-server's rule)."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


def _detokenized(state: ServerState, f: Fields) -> Response:
    tokens = f.array("tokens") or []
    n_vocab = state.model.n_vocab
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab for t in tokens):
        raise f.bad("tokens", f"a list of token ids from 0 to {n_vocab - 1}")
    piece = state.model.tokenizer.piece
    return json_response({"content": b"".join(piece(t) for t in tokens).decode("utf-8", errors="replace")})


@post(["/detokenize"], status_code=200)
async def detokenize(request: Request) -> Response:
    state = state_of(request)
    return await prepared(request, lambda f, _: _detokenized(state, f))


@get(["/health"], sync_to_thread=False)
def health() -> dict:
    return {"status": "ok"}


@get(["/props"], sync_to_thread=False)
def props(request: Request) -> dict:
    state = state_of(request)
    model, template = state.model, state.model.chat_template
    return {"default_generation_settings": {"params": {**state.defaults.as_dict(), "n_predict": -1},
                                            "n_ctx": state.n_ctx},
            "total_slots": state.worker.scheduler.slots, "model_alias": state.name, "model_path": str(model.path),
            "modalities": {"vision": False, "audio": False}, "chat_template": template.source,
            "bos_token": template.bos_token, "eos_token": template.eos_token,
            "build_info": f"kinetic {__version__}", "is_sleeping": False,
            "endpoint_slots": True, "endpoint_props": True, "endpoint_metrics": True}


@get(["/slots"], sync_to_thread=False)
def slots(request: Request) -> list:
    """Every slot (--parallel): the request it runs now, or the last one it ran."""
    state = state_of(request)
    return [_slot(state, i, job, busy) for i, (job, busy) in enumerate(state.worker.slots())]


def _slot(state: ServerState, slot_id: int, job, busy: bool) -> dict:
    slot = {"id": slot_id, "n_ctx": state.n_ctx, "speculative": False, "is_processing": busy}
    if job is not None:
        req = job.request
        remain = -1 if req.max_tokens is None else max(req.max_tokens - job.n_decoded, 0)
        slot.update({"id_task": job.id, "n_prompt_tokens": len(req.prompt),
                     "n_prompt_tokens_processed": job.n_prompt_processed,
                     "n_prompt_tokens_cache": job.generation.n_cached if job.generation else 0,
                     "params": _params(req, False),
                     "next_token": [{"has_next_token": busy, "has_new_line": False, "n_remain": remain,
                                     "n_decoded": job.n_decoded}],
                     "prompt": state.model.detokenize(list(req.prompt[:4096]))})
    return slot


@get(["/metrics", "/v1/metrics"], sync_to_thread=False)
def metrics(request: Request) -> Response:
    text = prometheus_text(state_of(request).worker)
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8",
                    headers={"Process-Start-Time-Unix": str(int(state_of(request).started))})


@post(["/apply-template"], status_code=200)
async def apply_template(request: Request) -> Response:
    """The prompt text /v1/chat/completions would run for this body (messages, tools and their
    generic fallback, chat_template_kwargs), as llama-server's /apply-template answers it."""
    state = state_of(request)
    ready = await prepared(request, lambda f, cancel: prepare_chat(state, f, cancel))
    return Response({"prompt": ready.prompt.text})


@post(["/infill"], status_code=200)
async def infill(request: Request) -> Response:
    raise not_supported("/infill (fill in the middle)")


ROUTES = [completion, tokenize_route, detokenize, health, props, slots, metrics, apply_template, infill]
