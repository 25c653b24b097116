"""OpenAI's API under /v1 (and without the prefix, as llama-server also serves it: /health, /models,
/chat/completions): health, models, chat completions and completions, streamed as server-sent
events or whole.

Owns: the OpenAI fields and response shapes, and what tool_choice means: "auto" offers the tools
and reads calls from the reply (unconstrained: lazy grammars are not built), "none" hides them,
"required" and a named function hold the reply to calls in the template's format with a grammar
(one call unless parallel_tool_calls). response_format, grammar and json_schema go through
constraints.py. n other than 1, receipts and echo are refused with a 400 naming the field.
Embeddings and rerank answer 400 naming the endpoints this text model serves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from litestar import Request, Response, get, post
from litestar.response import Stream

from kinetic import __version__
from kinetic.server.body import Fields
from kinetic.server.common import (
    SSE_DONE,
    SSE_HEADERS,
    guarded,
    legacy_logprobs,
    new_id,
    openai_logprob,
    prepared,
    sse,
    state_of,
    timings,
    usage,
    whole_answer,
)
from kinetic.server.constraints import GrammarSpec, compile_grammar, openai_grammar, tool_grammar
from kinetic.server.errors import ApiError, error_body, not_supported, path_of
from kinetic.server.options import ServerState
from kinetic.server.params import sampling_settings
from kinetic.server.prompts import (
    ChatPrompt,
    chat_prompt,
    check_ids,
    messages_from,
    template_kwargs,
    text_prompt,
    tools_from,
)
from kinetic.server.reply import ReplyStream, parse_whole
from kinetic.server.worker import Failed, Finished, GenerationRequest, Piece

FINGERPRINT = f"kinetic-{__version__}"


@dataclass(frozen=True)
class _Common:
    stream: bool
    include_usage: bool
    logprobs: bool
    top_logprobs: int
    stop: tuple[str, ...]
    max_tokens: int | None
    settings: object
    grammar: GrammarSpec | None  # response_format, grammar or json_schema


def _common(f: Fields, state: ServerState, chat: bool) -> _Common:
    for name in ("n", "best_of"):
        n = f.integer(name)
        if n is not None and n != 1:
            raise ApiError(400, f"{name} other than 1 is not supported yet", param=name)
    max_tokens = f.integer("max_completion_tokens", lo=1) if chat else None
    if max_tokens is None:
        max_tokens = f.integer("max_tokens", lo=1)
    stream = f.boolean("stream", False)
    include_usage = bool(Fields(f.obj("stream_options") or {}, "stream_options.").boolean("include_usage", False))
    if chat:
        logprobs = bool(f.boolean("logprobs", False))
        top = f.integer("top_logprobs", 0, 20) or 0
    else:
        count = f.integer("logprobs", 0, 20)
        logprobs, top = count is not None, count or 0
    grammar = openai_grammar(f)
    for name in ("receipt", "echo"):
        if f.boolean(name, False):
            raise not_supported(name)
    settings = sampling_settings(f, state.defaults, state.model.n_vocab, strict=True)
    return _Common(stream, include_usage, logprobs, top, f.strings("stop"), max_tokens, settings, grammar)


@dataclass(frozen=True)
class _Forced:
    """tool_choice "required" (name None) or a named function: the reply is held to calls."""

    name: str | None
    parallel: bool


def _tool_choice(f: Fields, tools: list | None) -> tuple[list | None, _Forced | None]:
    """The tools the template sees (all of them for auto and required, none for "none", the named
    one for a named function) and the forced call, if any."""
    parallel = bool(f.boolean("parallel_tool_calls", False))
    choice = f.raw("tool_choice", "auto")
    if choice == "none":
        return None, None
    if choice == "auto":
        return tools, None
    if choice == "required":
        if not tools:
            raise ApiError(400, 'tool_choice "required" needs a non-empty tools list', param="tool_choice")
        return tools, _Forced(None, parallel)
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type", "function") == "function" else None
    if isinstance(fn, dict) and isinstance(fn.get("name"), str):
        named = [t for t in tools or [] if t["function"]["name"] == fn["name"]]
        if not named:
            offered = ", ".join(repr(t["function"]["name"]) for t in tools or []) or "none"
            raise ApiError(400, f"tool_choice names the function {fn['name']!r}, which is not among the tools "
                                f"(offered: {offered})", param="tool_choice")
        return named, _Forced(fn["name"], parallel)
    raise f.bad("tool_choice", '"auto", "none", "required" or {"type": "function", "function": {"name": ...}}')


def _forced_grammar(forced: _Forced, prompt: ChatPrompt, tools: list) -> GrammarSpec:
    """The grammar of a forced call in the template's own format; a template with no known format
    gets Llama 3's bare JSON object (docs/grammar.md, "Forced tool calls"). An open <think> block is
    closed first; a template that knows <think> may reason in one whole block before the call."""
    think = "open" if prompt.reasoning_started else "optional" if prompt.thinks else None
    return tool_grammar(tools, prompt.tool_format or "llama3", forced.parallel, forced.name, think)


# -- routes --------------------------------------------------------------------------------------------


@get(["/v1/health"], sync_to_thread=False)
def health() -> dict:
    return {"status": "ok"}


@get(["/v1/models", "/models"], sync_to_thread=False)
def models(request: Request) -> dict:
    state = state_of(request)
    return {"object": "list", "data": [{"id": state.name, "object": "model", "created": int(state.started),
                                        "owned_by": "kinetic", "context_length": state.n_ctx}]}


@dataclass(frozen=True)
class _Prepared:
    """A request read, its prompt made and its grammar compiled (on the CpuPool), ready to submit."""

    common: _Common
    generation: GenerationRequest
    prompt: ChatPrompt | None = None
    tools: list | None = None


def _prepare_chat(state: ServerState, f: Fields, cancel) -> _Prepared:
    common = _common(f, state, chat=True)
    messages = messages_from(f)
    tools, forced = _tool_choice(f, tools_from(f))
    if forced is not None and common.grammar is not None:
        raise ApiError(400, f"a forced tool call (tool_choice) cannot be combined with {common.grammar.field}",
                       param=common.grammar.field)
    prompt = chat_prompt(state, messages, tools, template_kwargs(f), cancel)
    spec = common.grammar
    if forced is not None:
        spec = _forced_grammar(forced, prompt, tools)
        prompt = replace(prompt, tool_format=prompt.tool_format or "llama3", forced_calls=True)
    grammar = compile_grammar(state.worker.grammars, spec)
    generation = GenerationRequest(prompt.ids, common.settings, common.max_tokens, common.stop, common.logprobs,
                                   common.top_logprobs, keep_special=prompt.tool_format is not None, grammar=grammar)
    return _Prepared(common, generation, prompt, tools)


@post(["/v1/chat/completions", "/chat/completions"], status_code=200)
async def chat_completions(request: Request) -> Response:
    state = state_of(request)
    ready = await prepared(request, lambda f, cancel: _prepare_chat(state, f, cancel), json_only=True)
    common, prompt, tools = ready.common, ready.prompt, ready.tools
    job = state.worker.submit(ready.generation)
    head = {"id": new_id("chatcmpl"), "created": int(time.time()), "model": state.name,
            "system_fingerprint": FINGERPRINT}
    if common.stream:
        events = _chat_stream(job, head, prompt, tools, common, path_of(request))
        return Stream(guarded(events, path_of(request), sse), media_type="text/event-stream", headers=SSE_HEADERS)
    text, tokens, fin = await whole_answer(job, request)
    reply = parse_whole(text, prompt, tools)
    message: dict = {"role": "assistant", "content": reply.content if reply.content or not reply.tool_calls else None}
    if reply.reasoning_content is not None:
        message["reasoning_content"] = reply.reasoning_content
    if reply.tool_calls:
        message["tool_calls"] = [_call(c) for c in reply.tool_calls]
    choice = {"index": 0, "message": message, "finish_reason": _finish(fin, bool(reply.tool_calls)),
              "logprobs": {"content": [openai_logprob(t) for t in tokens]} if common.logprobs else None}
    return Response({**head, "object": "chat.completion", "choices": [choice], "usage": usage(fin),
                     "timings": timings(fin)})


def _call(call, index: int | None = None) -> dict:
    out = {"id": new_id("call"), "type": "function",
           "function": {"name": call.name, "arguments": call.arguments_json()}}
    return out if index is None else {"index": index, **out}


def _finish(fin: Finished, calls: bool) -> str:
    return "tool_calls" if calls and fin.finish_reason == "stop" else fin.finish_reason


async def _chat_stream(job, head: dict, prompt: ChatPrompt, tools, common: _Common, path: str):
    head = {**head, "object": "chat.completion.chunk"}

    def chunk(delta: dict, finish=None, logprobs=None) -> bytes:
        return sse({**head, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})

    yield chunk({"role": "assistant", "content": ""})
    reply = ReplyStream(prompt, tools)
    async for event in job.events():
        if isinstance(event, Piece):
            delta = _delta(*reply.feed(event.text))
            logprobs = {"content": [openai_logprob(t) for t in event.tokens]} if common.logprobs else None
            if delta or (logprobs and logprobs["content"]):
                yield chunk(delta, logprobs=logprobs)
        elif isinstance(event, Failed):
            yield sse(error_body(path, event.status, event.message))
            return
        else:
            reasoning, content, calls = reply.finish()
            if reasoning or content:
                yield chunk(_delta(reasoning, content))
            if calls:
                yield chunk({"tool_calls": [_call(c, i) for i, c in enumerate(calls)]})
            yield chunk({}, finish=_finish(event, bool(calls)))
            if common.include_usage:
                yield sse({**head, "choices": [], "usage": usage(event), "timings": timings(event)})
            yield SSE_DONE


def _delta(reasoning: str, content: str) -> dict:
    delta = {}
    if reasoning:
        delta["reasoning_content"] = reasoning
    if content:
        delta["content"] = content
    return delta


def _prepare_completion(state: ServerState, f: Fields) -> _Prepared:
    common = _common(f, state, chat=False)
    ids = _completion_prompt(f, state)
    grammar = compile_grammar(state.worker.grammars, common.grammar)
    return _Prepared(common, GenerationRequest(ids, common.settings, common.max_tokens, common.stop, common.logprobs,
                                               common.top_logprobs, grammar=grammar))


@post(["/v1/completions"], status_code=200)
async def completions(request: Request) -> Response:
    state = state_of(request)
    ready = await prepared(request, lambda f, _: _prepare_completion(state, f), json_only=True)
    common = ready.common
    job = state.worker.submit(ready.generation)
    head = {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()), "model": state.name,
            "system_fingerprint": FINGERPRINT}
    if common.stream:
        events = _completion_stream(job, head, common, path_of(request))
        return Stream(guarded(events, path_of(request), sse), media_type="text/event-stream", headers=SSE_HEADERS)
    text, tokens, fin = await whole_answer(job, request)
    choice = {"text": text, "index": 0, "finish_reason": fin.finish_reason,
              "logprobs": legacy_logprobs(tokens, 0) if common.logprobs else None}
    return Response({**head, "choices": [choice], "usage": usage(fin), "timings": timings(fin)})


def _completion_prompt(f: Fields, state: ServerState) -> tuple[int, ...]:
    """A string, a list of one string, or a list of token ids."""
    prompt = f.raw("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return text_prompt(state, prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return check_ids(state, prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise ApiError(400, "prompt: one prompt per request is supported (a list of several is not yet)", "prompt")
    raise f.bad("prompt", "a string, a list of one string, or a list of token ids")


async def _completion_stream(job, head: dict, common: _Common, path: str):
    offset = 0
    async for event in job.events():
        if isinstance(event, Piece):
            if event.text or (common.logprobs and event.tokens):
                lp = legacy_logprobs(event.tokens, offset) if common.logprobs else None
                offset += len(event.text)
                yield sse({**head, "choices": [{"text": event.text, "index": 0, "logprobs": lp,
                                                "finish_reason": None}]})
        elif isinstance(event, Failed):
            yield sse(error_body(path, event.status, event.message))
            return
        else:
            yield sse({**head, "choices": [{"text": "", "index": 0, "logprobs": None,
                                            "finish_reason": event.finish_reason}]})
            if common.include_usage:
                yield sse({**head, "choices": [], "usage": usage(event)})
            yield SSE_DONE


@post(["/v1/embeddings", "/v1/rerank", "/v1/reranking", "/rerank", "/reranking"], status_code=200)
async def not_this_model(request: Request) -> Response:
    raise ApiError(400, f"{state_of(request).name} is a text model, not an embedding or reranking model: "
                        "use /v1/chat/completions or /v1/completions")


ROUTES = [health, models, chat_completions, completions, not_this_model]
