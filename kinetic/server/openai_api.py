"""OpenAI's API under /v1 (and without the prefix, as llama-server also serves it: /health, /models,
/chat/completions): health, models, chat completions and completions, streamed as server-sent
events or whole.

Owns: the OpenAI fields and response shapes, and what tool_choice means: "auto" offers the tools
and reads calls from the reply (unconstrained: lazy grammars are not built; on a template with no
tool-call format, llama.cpp's generic fallback: generic_tools.py), "none" hides them,
"required" and a named function hold the reply to calls in the template's format with a grammar
(one call unless parallel_tool_calls). response_format, grammar and json_schema go through
constraints.py. "receipt": true adds a receipt (receipts.py). n other than 1 and echo are refused
with a 400 naming the field.
Embeddings and rerank are embedding_api.py's.
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
from kinetic.server.constraints import (
    GrammarSpec,
    compile_grammar,
    generic_tool_grammar,
    openai_grammar,
    tool_grammar,
)
from kinetic.server.errors import ApiError, error_body, not_supported, path_of
from kinetic.server.options import ServerState
from kinetic.server.params import sampling_settings
from kinetic.server.prompts import (
    GENERIC,
    ChatPrompt,
    chat_prompt,
    check_ids,
    generic_tools_prompt,
    messages_from,
    template_kwargs,
    template_tool_format,
    text_prompt,
    tools_from,
)
from kinetic.server.receipts import ReceiptAsk, receipt_ask, receipt_of
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
    if f.boolean("echo", False):
        raise not_supported("echo")
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
    return {"object": "list", "data": [_model_object(state)]}


def _model_object(state: ServerState) -> dict:
    return {"id": state.name, "object": "model", "created": int(state.started), "owned_by": "kinetic",
            "context_length": state.n_ctx}


@get(["/v1/models/{model_id:path}", "/models/{model_id:path}"], sync_to_thread=False)
def model(request: Request) -> dict:
    """OpenAI's model object for the one model served; 404 (code model_not_found) for any other id."""
    state, model_id = state_of(request), request.path_params["model_id"].lstrip("/")
    if model_id != state.name:
        raise ApiError(404, f"The model '{model_id}' does not exist: this server serves '{state.name}'",
                       param="model", kind="invalid_request_error", extra={"code": "model_not_found"})
    return _model_object(state)


@dataclass(frozen=True)
class ChatPrepared:
    """A request read, its prompt made and its grammar compiled (on the CpuPool), ready to submit."""

    common: _Common
    generation: GenerationRequest
    prompt: ChatPrompt | None = None
    tools: list | None = None
    receipt: ReceiptAsk | None = None  # "receipt": true


def prepare_chat(state: ServerState, f: Fields, cancel) -> ChatPrepared:
    common = _common(f, state, chat=True)
    messages = messages_from(f)
    tools, forced = _tool_choice(f, tools_from(f))
    if forced is not None and common.grammar is not None:
        raise ApiError(400, f"a forced tool call (tool_choice) cannot be combined with {common.grammar.field}",
                       param=common.grammar.field)
    spec = common.grammar
    if tools and forced is None and template_tool_format(state) is None:  # the generic fallback
        spec = generic_tool_grammar(tools, bool(f.boolean("parallel_tool_calls", False)), common.grammar)
        prompt = generic_tools_prompt(state, messages, tools, template_kwargs(f), cancel)
    else:
        prompt = chat_prompt(state, messages, tools, template_kwargs(f), cancel)
    if forced is not None:
        spec = _forced_grammar(forced, prompt, tools)
        prompt = replace(prompt, tool_format=prompt.tool_format or "llama3", forced_calls=True)
    grammar = compile_grammar(state.worker.grammars, spec)
    generation = GenerationRequest(prompt.ids, common.settings, common.max_tokens, common.stop, common.logprobs,
                                   common.top_logprobs, keep_special=prompt.tool_format not in (None, GENERIC),
                                   grammar=grammar)
    held_by = "tools" if tools else spec.field if spec is not None else None
    receipt = receipt_ask(f, input=messages, max_tokens=common.max_tokens, stop=common.stop, held_by=held_by)
    return ChatPrepared(common, generation, prompt, tools, receipt)


@post(["/v1/chat/completions", "/chat/completions"], status_code=200)
async def chat_completions(request: Request) -> Response:
    state = state_of(request)
    ready = await prepared(request, lambda f, cancel: prepare_chat(state, f, cancel), json_only=True)
    common, prompt, tools = ready.common, ready.prompt, ready.tools
    job = state.worker.submit(ready.generation)
    head = {"id": new_id("chatcmpl"), "created": int(time.time()), "model": state.name,
            "system_fingerprint": FINGERPRINT}
    if common.stream:
        events = _chat_stream(job, head, ready, path_of(request), state)
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
    body = {**head, "object": "chat.completion", "choices": [choice], "usage": usage(fin), "timings": timings(fin)}
    if ready.receipt is not None:
        body["receipt"] = await receipt_of(state, ready.receipt, ready.generation, text, fin)
    return Response(body)


def _call(call, index: int | None = None) -> dict:
    out = {"id": new_id("call"), "type": "function",
           "function": {"name": call.name, "arguments": call.arguments_json()}}
    return out if index is None else {"index": index, **out}


def _finish(fin: Finished, calls: bool) -> str:
    return "tool_calls" if calls and fin.finish_reason == "stop" else fin.finish_reason


async def _chat_stream(job, head: dict, ready: ChatPrepared, path: str, state: ServerState):
    head = {**head, "object": "chat.completion.chunk"}
    prompt, tools, common = ready.prompt, ready.tools, ready.common
    text: list[str] = []

    def chunk(delta: dict, finish=None, logprobs=None) -> bytes:
        return sse({**head, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})

    yield chunk({"role": "assistant", "content": ""})
    reply = ReplyStream(prompt, tools)
    async for event in job.events():
        if isinstance(event, Piece):
            text.append(event.text)
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
            last = {**head, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                         "finish_reason": _finish(event, bool(calls))}]}
            for frame in await _last_frames(state, ready, last, "".join(text), event):
                yield frame


async def _last_frames(state: ServerState, ready: ChatPrepared, last: dict, text: str, fin: Finished) -> list[bytes]:
    """The stream's closing chunks: `last` (the finish reason), the usage chunk when asked for, the
    receipt in the last of them when asked for, then [DONE]."""
    chunks = [last]
    if ready.common.include_usage:
        chunks.append({**{k: v for k, v in last.items() if k != "choices"}, "choices": [], "usage": usage(fin),
                       "timings": timings(fin)})
    if ready.receipt is not None:
        chunks[-1] = {**chunks[-1], "receipt": await receipt_of(state, ready.receipt, ready.generation, text, fin)}
    return [*(sse(c) for c in chunks), SSE_DONE]


def _delta(reasoning: str, content: str) -> dict:
    delta = {}
    if reasoning:
        delta["reasoning_content"] = reasoning
    if content:
        delta["content"] = content
    return delta


def _prepare_completion(state: ServerState, f: Fields) -> ChatPrepared:
    common = _common(f, state, chat=False)
    ids = _completion_prompt(f, state)
    grammar = compile_grammar(state.worker.grammars, common.grammar)
    prompt = f.raw("prompt")
    text = prompt if isinstance(prompt, str) else prompt[0] if isinstance(prompt, list) and len(prompt) == 1 \
        and isinstance(prompt[0], str) else None
    receipt = receipt_ask(f, input=text, max_tokens=common.max_tokens, stop=common.stop,
                          held_by=None if common.grammar is None else common.grammar.field)
    return ChatPrepared(common, GenerationRequest(ids, common.settings, common.max_tokens, common.stop, common.logprobs,
                                               common.top_logprobs, grammar=grammar), receipt=receipt)


@post(["/v1/completions"], status_code=200)
async def completions(request: Request) -> Response:
    state = state_of(request)
    ready = await prepared(request, lambda f, _: _prepare_completion(state, f), json_only=True)
    common = ready.common
    job = state.worker.submit(ready.generation)
    head = {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()), "model": state.name,
            "system_fingerprint": FINGERPRINT}
    if common.stream:
        events = _completion_stream(job, head, ready, path_of(request), state)
        return Stream(guarded(events, path_of(request), sse), media_type="text/event-stream", headers=SSE_HEADERS)
    text, tokens, fin = await whole_answer(job, request)
    choice = {"text": text, "index": 0, "finish_reason": fin.finish_reason,
              "logprobs": legacy_logprobs(tokens, 0) if common.logprobs else None}
    body = {**head, "choices": [choice], "usage": usage(fin), "timings": timings(fin)}
    if ready.receipt is not None:
        body["receipt"] = await receipt_of(state, ready.receipt, ready.generation, text, fin)
    return Response(body)


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


async def _completion_stream(job, head: dict, ready: ChatPrepared, path: str, state: ServerState):
    common = ready.common
    offset = 0
    text: list[str] = []
    async for event in job.events():
        if isinstance(event, Piece):
            text.append(event.text)
            if event.text or (common.logprobs and event.tokens):
                lp = legacy_logprobs(event.tokens, offset) if common.logprobs else None
                offset += len(event.text)
                yield sse({**head, "choices": [{"text": event.text, "index": 0, "logprobs": lp,
                                                "finish_reason": None}]})
        elif isinstance(event, Failed):
            yield sse(error_body(path, event.status, event.message))
            return
        else:
            last = {**head, "choices": [{"text": "", "index": 0, "logprobs": None,
                                         "finish_reason": event.finish_reason}]}
            for frame in await _last_frames(state, ready, last, "".join(text), event):
                yield frame


ROUTES = [health, models, model, chat_completions, completions]  # embeddings and rerank: embedding_api.py
