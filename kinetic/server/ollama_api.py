"""Ollama's API under /api: version, tags, ps, show, chat and generate (NDJSON unless "stream": false).

Owns: Ollama's field names (options.num_predict and the sampler options), its response shapes and
its {"error": "..."} bodies. Embeddings answer 400 naming the endpoints this text model serves;
suffix, template and context are refused (the prompt always goes through the model's own
template, and a conversation is resent as messages); format ("json" or a JSON Schema) holds the
answer with a grammar (constraints.py). tools on a template with no tool-call format take the
generic fallback (generic_tools.py), as on the OpenAI routes.
Like Ollama, these routes take bodies of any content type.
"""

from __future__ import annotations

import datetime
import hashlib
from dataclasses import dataclass

from litestar import Request, Response, get, post
from litestar.response import Stream

from kinetic.frontend.model_info import describe
from kinetic.server.body import Fields
from kinetic.server.common import guarded, ndjson, prepared, state_of, whole_answer
from kinetic.server.constraints import GrammarSpec, compile_grammar, generic_tool_grammar, ollama_grammar
from kinetic.server.errors import ApiError, context_exceeded, not_supported, path_of
from kinetic.server.options import ServerState
from kinetic.server.params import sampling_settings
from kinetic.server.prompts import (
    GENERIC,
    ChatPrompt,
    chat_prompt,
    fitted_chat_prompt,
    generic_tools_prompt,
    messages_from,
    template_tool_format,
    text_prompt,
    tools_from,
)
from kinetic.server.reply import ReplyStream, parse_whole
from kinetic.server.textstream import THINK_CLOSE, THINK_OPEN
from kinetic.server.worker import Failed, Finished, GenerationRequest, Piece

OLLAMA_VERSION = "0.13.0"  # the Ollama release whose API these routes follow
NDJSON = "application/x-ndjson"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def _details(state: ServerState) -> dict:
    info = describe(state.model.gguf)
    arch = info.architecture or ""
    size = info.parameters
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch] if arch else [],
            "parameter_size": f"{size / 1e9:.1f}B" if size >= 1e9 else f"{size / 1e6:.0f}M",
            "quantization_level": info.weights[0].type if info.weights else ""}


def _entry(state: ServerState) -> dict:
    path = state.model.path
    stat = path.stat()
    modified = datetime.datetime.fromtimestamp(stat.st_mtime, datetime.timezone.utc).isoformat()
    digest = hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
    return {"name": state.name, "model": state.name, "modified_at": modified, "size": stat.st_size,
            "digest": digest, "details": _details(state)}


# -- listing routes ---------------------------------------------------------------------------------------


@get(["/api/version"], sync_to_thread=False)
def version() -> dict:
    return {"version": OLLAMA_VERSION}


@get(["/api/tags"], sync_to_thread=False)
def tags(request: Request) -> dict:
    return {"models": [_entry(state_of(request))]}


@get(["/api/ps"], sync_to_thread=False)
def ps(request: Request) -> dict:
    state = state_of(request)
    forever = "2318-01-01T00:00:00Z"  # the model stays loaded while the server runs
    return {"models": [{**_entry(state), "expires_at": forever, "size_vram": 0, "context_length": state.n_ctx}]}


@post(["/api/show"], status_code=200)
async def show(request: Request) -> dict:
    state = state_of(request)
    await prepared(request, lambda f, _: None)  # the one model is shown whatever name is asked for
    source = state.model.chat_template.source
    caps = ["completion", "tools"]  # a template with no tool-call format gets the generic fallback
    if THINK_OPEN in source and THINK_CLOSE in source:
        caps.append("thinking")
    meta = state.model.gguf.metadata
    info = {k: v for k, v in meta.items() if isinstance(v, (str, int, float, bool)) and not k.startswith("tokenizer.")}
    return {"license": str(meta.get("general.license", "")), "modelfile": "", "parameters": "", "template": source,
            "details": _details(state), "model_info": info, "capabilities": caps,
            "modified_at": _entry(state)["modified_at"]}


# -- generation -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Prepared:
    """A request read and its prompt made (on the CpuPool), ready to submit."""

    generation: GenerationRequest | None  # None: /api/generate with an empty prompt (Ollama's "load")
    stream: bool
    prompt: ChatPrompt | None = None
    tools: list | None = None


def _generation(f: Fields, state: ServerState, ids, spec: GrammarSpec | None,
                keep_special: bool = False) -> GenerationRequest:
    """The answer's request; with num_ctx, prompt and answer together stay within that window."""
    options = Fields(f.obj("options") or {}, "options.")
    num_predict = options.integer("num_predict")
    settings = sampling_settings(options, state.defaults, state.model.n_vocab)
    max_tokens = None if num_predict is None or num_predict < 0 else num_predict
    window = _window(f, state)
    if window < state.n_ctx:
        max_tokens = min(window - len(ids), max_tokens if max_tokens is not None else window)
    grammar = compile_grammar(state.worker.grammars, spec)
    return GenerationRequest(ids, settings, max_tokens, options.strings("stop"), keep_special=keep_special,
                             grammar=grammar)


def _think(f: Fields) -> dict:
    """think: true/false (or an effort name, read as true) -> the template's enable_thinking."""
    think = f.raw("think")
    if think is None:
        return {}
    if not isinstance(think, (bool, str)):
        raise f.bad("think", "true or false")
    return {"enable_thinking": bool(think)}


def _stats(fin: Finished) -> dict:
    prompt_ns, eval_ns = int(fin.prompt_seconds * 1e9), int(fin.generate_seconds * 1e9)
    return {"done_reason": fin.finish_reason, "total_duration": prompt_ns + eval_ns, "load_duration": 0,
            "prompt_eval_count": fin.prompt_tokens - fin.cached_tokens, "prompt_eval_duration": prompt_ns,
            "eval_count": fin.generated_tokens, "eval_duration": eval_ns}


def _calls(calls) -> list[dict]:
    return [{"function": {"index": i, "name": c.name, "arguments": c.arguments}} for i, c in enumerate(calls)]


def _window(f: Fields, state: ServerState) -> int:
    """options.num_ctx within the server's context (a larger one is the server's: -c sets it)."""
    num_ctx = Fields(f.obj("options") or {}, "options.").integer("num_ctx", lo=2)
    return state.n_ctx if num_ctx is None else min(num_ctx, state.n_ctx)


def _prepare_chat(state: ServerState, f: Fields, cancel) -> _Prepared:
    messages = messages_from(f)
    tools = tools_from(f)
    generic = bool(tools) and template_tool_format(state) is None  # the generic fallback (generic_tools.py)
    grammar = generic_tool_grammar(tools, False, ollama_grammar(f)) if generic else ollama_grammar(f)

    def render(kept: list[dict]) -> ChatPrompt:
        if generic:
            return generic_tools_prompt(state, kept, tools, _think(f), cancel)
        return chat_prompt(state, kept, tools, _think(f), cancel)

    prompt = fitted_chat_prompt(render, messages, _window(f, state), bool(f.boolean("truncate", True)))
    generation = _generation(f, state, prompt.ids, grammar, keep_special=prompt.tool_format not in (None, GENERIC))
    return _Prepared(generation, bool(f.boolean("stream", True)), prompt, tools)


@post(["/api/chat"], status_code=200)
async def chat(request: Request) -> Response:
    state = state_of(request)
    ready = await prepared(request, lambda f, cancel: _prepare_chat(state, f, cancel))
    prompt, tools = ready.prompt, ready.tools
    job = state.worker.submit(ready.generation)
    if ready.stream:
        return Stream(guarded(_chat_stream(job, state, prompt, tools), path_of(request), ndjson), media_type=NDJSON)
    text, _, fin = await whole_answer(job, request)
    reply = parse_whole(text, prompt, tools)
    message = {"role": "assistant", "content": reply.content}
    if reply.reasoning_content:
        message["thinking"] = reply.reasoning_content
    if reply.tool_calls:
        message["tool_calls"] = _calls(reply.tool_calls)
    return Response({"model": state.name, "created_at": _now(), "message": message, "done": True, **_stats(fin)})


async def _chat_stream(job, state: ServerState, prompt: ChatPrompt, tools):
    reply = ReplyStream(prompt, tools)

    def line(content: str, thinking: str = "", calls=None, done: dict | None = None) -> bytes:
        message = {"role": "assistant", "content": content}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = _calls(calls)
        return ndjson({"model": state.name, "created_at": _now(), "message": message, "done": done is not None,
                       **(done or {})})

    async for event in job.events():
        if isinstance(event, Piece):
            thinking, content = reply.feed(event.text)
            if thinking or content:
                yield line(content, thinking)
        elif isinstance(event, Failed):
            yield ndjson({"error": event.message})
            return
        else:
            thinking, content, calls = reply.finish()
            if thinking or content or calls:
                yield line(content, thinking, calls)
            yield line("", done=_stats(event))


def _prepare_generate(state: ServerState, f: Fields, cancel) -> _Prepared:
    for name in ("suffix", "template", "context"):
        if f.raw(name) not in (None, "", []):
            raise ApiError(400, f"{name} is not supported: " + {
                "suffix": "fill-in-the-middle is not available", "template": "the model's own template is used",
                "context": "send the conversation as messages to /api/chat"}[name], param=name)
    if f.raw("images"):
        raise not_supported("images", ": this server has no vision model")
    text = f.string("prompt", "")
    stream = bool(f.boolean("stream", True))
    if not text:
        return _Prepared(None, stream)
    window = _window(f, state)
    if f.boolean("raw", False):
        ids, prompt = text_prompt(state, text), None
        if len(ids) >= window:
            raise context_exceeded(len(ids), window)
    else:
        system = f.string("system")
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        prompt = fitted_chat_prompt(lambda kept: chat_prompt(state, kept, None, _think(f), cancel), messages, window,
                                    bool(f.boolean("truncate", True)))
        ids = prompt.ids
    return _Prepared(_generation(f, state, ids, ollama_grammar(f)), stream, prompt)


@post(["/api/generate"], status_code=200)
async def generate(request: Request) -> Response:
    state = state_of(request)
    ready = await prepared(request, lambda f, cancel: _prepare_generate(state, f, cancel))
    if ready.generation is None:  # Ollama answers an empty prompt by loading the model
        return Response({"model": state.name, "created_at": _now(), "response": "", "done": True,
                         "done_reason": "load"})
    prompt = ready.prompt
    job = state.worker.submit(ready.generation)
    if ready.stream:
        return Stream(guarded(_generate_stream(job, state, prompt), path_of(request), ndjson), media_type=NDJSON)
    text, _, fin = await whole_answer(job, request)
    body = {"model": state.name, "created_at": _now(), "response": text, "done": True, **_stats(fin)}
    if prompt is not None and prompt.thinks:
        reply = parse_whole(text, prompt, None)
        body["response"] = reply.content
        if reply.reasoning_content:
            body["thinking"] = reply.reasoning_content
    return Response(body)


async def _generate_stream(job, state: ServerState, prompt: ChatPrompt | None):
    reply = ReplyStream(prompt) if prompt is not None and prompt.thinks else None

    def line(response: str, thinking: str = "", done: dict | None = None) -> bytes:
        body = {"model": state.name, "created_at": _now(), "response": response, "done": done is not None}
        if thinking:
            body["thinking"] = thinking
        return ndjson({**body, **(done or {})})

    async for event in job.events():
        if isinstance(event, Piece):
            thinking, text = reply.feed(event.text) if reply else ("", event.text)
            if thinking or text:
                yield line(text, thinking)
        elif isinstance(event, Failed):
            yield ndjson({"error": event.message})
            return
        else:
            if reply:
                thinking, text, _ = reply.finish()
                if thinking or text:
                    yield line(text, thinking)
            yield line("", done=_stats(event))


ROUTES = [version, tags, ps, show, chat, generate]  # "/" (Ollama's "is running") is page.py's
