"""Anthropic's Messages API: POST /v1/messages (whole or streamed) and /v1/messages/count_tokens.

Owns: Anthropic's request fields read into the OpenAI chat request they mean, and the answer in
Anthropic's shapes. `system` (a string or text blocks) becomes the system message; content blocks
text, tool_use (assistant) and tool_result (user) become text, tool_calls and tool messages;
thinking blocks are the assistant's reasoning_content; `tools` (name, description, input_schema)
and `tool_choice` (auto, any: OpenAI's "required", tool: a named function, none) as on
/v1/chat/completions, one call per answer unless disable_parallel_tool_use is false;
stop_sequences, max_tokens, temperature, top_p, top_k (and Kinetic's other sampler fields and
seed); metadata and anything else Anthropic-only are ignored. The answer: content blocks (thinking,
text, tool_use), stop_reason (end_turn, max_tokens, stop_sequence with the sequence, tool_use) and
usage; streamed, the event sequence message_start, content_block_start / content_block_delta
(text_delta, thinking_delta, input_json_delta) / content_block_stop, message_delta, message_stop.
The request itself runs as the chat route's (chat_run.py); errors come in Anthropic's shape
(errors.py). Images and documents answer 400 (no vision models yet).
"""

from __future__ import annotations

import json
import secrets

from litestar import Request, Response, post
from litestar.response import Stream

from kinetic.runtime.sampling.settings import LIMITS
from kinetic.server import chat_run
from kinetic.server.body import Fields
from kinetic.server.chat_run import Done
from kinetic.server.common import SSE_HEADERS, guarded, sse, state_of
from kinetic.server.errors import ApiError, error_body, not_supported, path_of
from kinetic.server.worker import Failed, Finished

PASSED_ON = (*LIMITS, "seed", "stream")  # fields whose meaning is the same on /v1/chat/completions


def anthropic_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


# -- the request --------------------------------------------------------------------------------------------


def openai_body(f: Fields) -> dict:
    """The /v1/chat/completions body that asks for what this Messages API body asks for."""
    out: dict = {name: f.raw(name) for name in PASSED_ON if f.has(name)}
    out["messages"] = _system(f) + _messages(f)
    max_tokens = f.integer("max_tokens", lo=1)
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    stops = f.strings("stop_sequences", single=False)
    if stops:
        out["stop"] = list(stops)
    tools = _tools(f)
    if tools:
        out["tools"] = tools
    out.update(_tool_choice(f))
    return out


def _system(f: Fields) -> list[dict]:
    system = f.raw("system")
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    if not isinstance(system, list):
        raise f.bad("system", "a string or a list of text blocks")
    return [{"role": "system", "content": _texts(system, "system")}]


def _texts(blocks: list, where: str) -> str:
    """Text blocks joined (as llama-server joins a system prompt's blocks)."""
    texts = []
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise ApiError(400, f"{where}[{i}] must be a text block {{\"type\": \"text\", \"text\": ...}}",
                           param=f"{where}[{i}]")
        texts.append(block["text"])
    return "".join(texts)


def _messages(f: Fields) -> list[dict]:
    messages = f.array("messages")
    if not messages:
        raise ApiError(400, "messages must be a non-empty list of messages", param="messages")
    names: dict[str, str] = {}  # tool_use id -> the tool's name, for the tool results that answer it
    out: list[dict] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise ApiError(400, f"{where} must be an object with role user or assistant", param=f"{where}.role")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
        elif isinstance(content, list):
            out += _blocks(m["role"], content, f"{where}.content", names)
        else:
            raise ApiError(400, f"{where}.content must be a string or a list of content blocks",
                           param=f"{where}.content")
    return out


def _blocks(role: str, blocks: list, where: str, names: dict[str, str]) -> list[dict]:
    """One Anthropic message's blocks as OpenAI messages: tool results (as tool messages) first,
    then the text, tool calls and reasoning in one message of the role."""
    texts, calls, results, reasoning = [], [], [], []
    for i, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        at = f"{where}[{i}]"
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant" and isinstance(block.get("name"), str):
            names[str(block.get("id"))] = block["name"]
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block["name"], "arguments": block.get("input") or {}}})
        elif kind == "tool_result" and role == "user":
            results.append(_tool_result(block, at, names))
        elif kind == "thinking" and role == "assistant":
            reasoning.append(str(block.get("thinking", "")))
        elif kind == "redacted_thinking":
            continue
        elif kind in ("image", "document"):
            raise not_supported(f"{at} ({kind})", ": this server has no vision model", param=at)
        else:
            raise ApiError(400, f"{at} must be a text, tool_use (assistant), tool_result (user) or thinking "
                                f"block, not {json.dumps(kind)[:40]}", param=at)
    out = list(results)
    if texts or calls or reasoning or not results:
        message: dict = {"role": role, "content": "\n".join(texts)}
        if calls:
            message["tool_calls"] = calls
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
        out.append(message)
    return out


def _tool_result(block: dict, where: str, names: dict[str, str]) -> dict:
    content = block.get("content", "")
    if isinstance(content, list):
        content = _texts(content, f"{where}.content")
    elif not isinstance(content, str):
        raise ApiError(400, f"{where}.content must be a string or a list of text blocks", param=f"{where}.content")
    call_id = str(block.get("tool_use_id", ""))
    message = {"role": "tool", "tool_call_id": call_id, "content": content}
    if call_id in names:
        message["name"] = names[call_id]
    return message


def _tools(f: Fields) -> list[dict]:
    tools = []
    for i, tool in enumerate(f.array("tools") or []):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"]:
            raise ApiError(400, f"tools[{i}] must have a name (and an input_schema)", param=f"tools[{i}]")
        if tool.get("type") not in (None, "custom"):
            raise not_supported(f"tools[{i}] of type {tool['type']}", ": only client tools with an input_schema",
                                param=f"tools[{i}]")
        function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(f: Fields) -> dict:
    choice = f.obj("tool_choice")
    if choice is None:
        return {}
    kind = choice.get("type")
    parallel = {"parallel_tool_calls": True} if choice.get("disable_parallel_tool_use") is False else {}
    if kind in ("auto", "none"):
        return {"tool_choice": kind, **parallel}
    if kind == "any":
        return {"tool_choice": "required", **parallel}
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"tool_choice": {"type": "function", "function": {"name": choice["name"]}}, **parallel}
    raise f.bad("tool_choice", '{"type": "auto"}, {"type": "any"}, {"type": "none"} or {"type": "tool", "name": ...}')


# -- the answer ---------------------------------------------------------------------------------------------


def stop_reason(fin: Finished, calls: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence)."""
    if calls and fin.finish_reason == "stop":
        return "tool_use", None
    if fin.finish_reason == "length":
        return "max_tokens", None
    if fin.stop_type == "word":
        return "stop_sequence", fin.stopping_word
    return "end_turn", None


def _tool_use(call) -> dict:
    return {"type": "tool_use", "id": anthropic_id("toolu"), "name": call.name, "input": call.arguments}


def _message(head: dict, done: Done) -> dict:
    blocks = []
    if done.reasoning:
        blocks.append({"type": "thinking", "thinking": done.reasoning, "signature": ""})
    if done.content:
        blocks.append({"type": "text", "text": done.content})
    blocks += [_tool_use(c) for c in done.calls]
    reason, sequence = stop_reason(done.fin, bool(done.calls))
    return {**head, "content": blocks, "stop_reason": reason, "stop_sequence": sequence,
            "usage": _usage(done.fin.prompt_tokens, done.fin.generated_tokens, done.fin.cached_tokens)}


def _usage(input_tokens: int, output_tokens: int, cached: int = 0) -> dict:
    """Anthropic's usage: input_tokens leaves out the prompt tokens read from the cache (Warm Start)."""
    return {"input_tokens": input_tokens - cached, "output_tokens": output_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached}


@post(["/v1/messages"], status_code=200)
async def messages(request: Request) -> Response:
    ready = await chat_run.prepare(request, openai_body)
    job = chat_run.submit(request, ready)
    head = {"id": anthropic_id("msg"), "type": "message", "role": "assistant", "model": state_of(request).name}
    if ready.common.stream:
        path = path_of(request)
        events = _stream(job, ready, head, path)
        return Stream(guarded(events, path, _error_event), media_type="text/event-stream", headers=SSE_HEADERS)
    return Response(_message(head, await chat_run.whole(job, request, ready)))


@post(["/v1/messages/count_tokens"], status_code=200)
async def count_tokens(request: Request) -> Response:
    """The prompt's tokens as /v1/messages would run it (the template rendered, tools included)."""
    ready = await chat_run.prepare(request, lambda f: {**openai_body(f), "stream": False})
    return Response({"input_tokens": len(ready.generation.prompt)})


def event(kind: str, data: dict) -> bytes:
    """One server-sent event as Anthropic writes it: the event name, then the data with its type."""
    return f"event: {kind}\n".encode() + sse({"type": kind, **data})


def _error_event(body: dict) -> bytes:
    return event("error", {"error": body["error"]})


class _Blocks:
    """The stream's content blocks: text and thinking deltas open a block of their kind (closing the
    one before), tool calls are a block each."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None

    def write(self, kind: str, text: str) -> list[bytes]:
        if not text:
            return []
        frames = []
        if self.open != kind:
            frames = self.close()
            self.index, self.open = self.index + 1, kind
            block = {"type": "text", "text": ""} if kind == "text" else \
                {"type": "thinking", "thinking": "", "signature": ""}
            frames.append(event("content_block_start", {"index": self.index, "content_block": block}))
        delta = {"type": "text_delta", "text": text} if kind == "text" else {"type": "thinking_delta", "thinking": text}
        frames.append(event("content_block_delta", {"index": self.index, "delta": delta}))
        return frames

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [event("content_block_stop", {"index": self.index})]

    def tool_use(self, call) -> list[bytes]:
        frames = self.close()
        self.index += 1
        block = {**_tool_use(call), "input": {}}
        delta = {"type": "input_json_delta", "partial_json": call.arguments_json()}
        return frames + [event("content_block_start", {"index": self.index, "content_block": block}),
                         event("content_block_delta", {"index": self.index, "delta": delta}),
                         event("content_block_stop", {"index": self.index})]


async def _stream(job, ready, head: dict, path: str):
    start = {**head, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": _usage(len(ready.generation.prompt), 0)}
    yield event("message_start", {"message": start})
    blocks = _Blocks()
    async for item in chat_run.deltas(job, ready):
        if isinstance(item, Failed):
            yield _error_event(error_body(path, item.status, item.message))
            return
        frames = blocks.write("thinking", item.reasoning) + blocks.write("text", item.content)
        if isinstance(item, Done):
            for call in item.calls:
                frames += blocks.tool_use(call)
            frames += blocks.close()
            reason, sequence = stop_reason(item.fin, bool(item.calls))
            frames += [event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence},
                                               "usage": {"output_tokens": item.fin.generated_tokens}}),
                       event("message_stop", {})]
        for frame in frames:
            yield frame


ROUTES = [messages, count_tokens]
