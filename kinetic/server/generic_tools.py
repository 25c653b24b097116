"""Tools for a chat template that has no place for them: llama.cpp's generic tool-call format.

Owns: what llama-server does when a request offers tools (`tool_choice: "auto"`) and the template
knows no tool-call format (SmolLM2's, Gemma 3's): the tools are described in a system message
(llama.cpp's generic format adds "Respond in JSON format, ..." and minja's tools polyfill the tool
list, joined to an existing system message by a blank line), and the reply is held by a JSON
Schema grammar to either a call or a response (common/chat-parsers/generic.cpp):

    {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    {"tool_calls": [{"name": ..., "arguments": {...}, "id": "..."}]}   (parallel_tool_calls)
    {"response": "It is sunny."}                (a response_format schema replaces the string)

Earlier turns are rewritten the way minja polyfills them for such templates: an assistant's calls
become its content in the same JSON, a tool result a user message {"tool_response": {...}}. The
reply is read back into tool calls or content, whole (`parse_generic`) or piece by piece
(`GenericStream`: the response text streams as it is written, calls come whole at the end).
Does not own: the grammar compiler (kinetic/grammar), rendering (prompts.py), response shapes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from kinetic.frontend.output_parsing import ToolCall

RESPOND = ("Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` reply to "
           "the user's request")
TOOLS_INTRO = "You can call any of the following tools to satisfy the user's requests: "
STRING = {"type": "string"}


def messages_with_tools(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The conversation as the template will render it: the instruction and the tools in the system
    message, earlier calls and tool results written in the generic format."""
    text = f"{RESPOND}\n\n{TOOLS_INTRO}{json.dumps(tools, indent=2, ensure_ascii=False)}"
    out = [_rewritten(m) for m in messages]
    if out and out[0]["role"] == "system":
        return [{"role": "system", "content": f"{out[0]['content']}\n\n{text}"}, *out[1:]]
    return [{"role": "system", "content": text}, *out]


def _rewritten(message: dict) -> dict:
    if message["role"] == "tool":
        reply = {"content": message.get("content", "")}
        if message.get("name"):
            reply = {"tool": message["name"], **reply}
        if message.get("tool_call_id"):
            reply["tool_call_id"] = message["tool_call_id"]
        return {"role": "user", "content": json.dumps({"tool_response": reply}, indent=2, ensure_ascii=False)}
    calls = message.get("tool_calls")
    if message["role"] != "assistant" or not calls:
        return message
    written = [{"name": c["function"]["name"], "arguments": _arguments(c["function"].get("arguments"))} for c in calls]
    if len(written) > 1:  # parallel calls carry their ids, as the parallel schema asks
        written = [{**w, "id": c["id"]} if c.get("id") else w for w, c in zip(written, calls, strict=True)]
    body = {"tool_call": written[0]} if len(written) == 1 else {"tool_calls": written}
    content = message.get("content") or ""
    text = json.dumps(body, ensure_ascii=False)
    return {"role": "assistant", "content": f"{content}\n{text}" if content else text}


def _arguments(value):
    """A call's arguments as an object (OpenAI clients send them as JSON text)."""
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return value
    return {} if value is None else value


def generic_schema(tools: list[dict], *, parallel: bool, response: object = None) -> dict:
    """The JSON Schema of a reply: a call to one of `tools` (several with `parallel`, each with an
    id of 4 or more characters, as llama.cpp asks) or a response (a string, or `response`'s schema)."""
    calls = []
    for tool in tools:
        fn = tool["function"]
        properties = {"name": {"type": "string", "const": fn["name"]},
                      "arguments": fn.get("parameters") or {"type": "object", "properties": {}}}
        required = ["name", "arguments"]
        if parallel:
            properties["id"] = {"type": "string", "minLength": 4}
            required.append("id")
        calls.append({"type": "object", "properties": properties, "required": required})
    one = calls[0] if len(calls) == 1 else {"anyOf": calls}
    call = ({"type": "object", "properties": {"tool_calls": {"type": "array", "items": one, "minItems": 1}},
             "required": ["tool_calls"]} if parallel else
            {"type": "object", "properties": {"tool_call": one}, "required": ["tool_call"]})
    answer = {"type": "object", "properties": {"response": STRING if response is None else response},
              "required": ["response"]}
    return {"anyOf": [call, answer]}


def parse_generic(text: str) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a whole reply. A reply cut inside its response string (max_tokens) gives
    the text written so far, as a stream sends it; any other reply that is not the format's JSON is
    content as written."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        opening = _RESPONSE_OPENING.match(text)
        return (text if opening is None else _decoded_prefix(text[opening.end():])), []
    if not isinstance(value, dict):
        return text, []
    if "response" in value:
        response = value["response"]
        return (response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)), []
    written = [value["tool_call"]] if "tool_call" in value else value.get("tool_calls") or []
    calls = [ToolCall(c["name"], c.get("arguments") or {}) for c in written
             if isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("arguments", {}), dict)]
    return ("", calls) if calls else (text, [])


_RESPONSE_OPENING = re.compile(r'\s*\{\s*"response"\s*:\s*"')
_HEX = re.compile(r"[0-9a-fA-F]{4}")


@dataclass
class GenericStream:
    """feed(text) -> the response text that can go out now; finish() -> (the rest, tool calls).
    Until the reply's first key is known nothing is sent; a string response is then decoded as it
    arrives (an escape split across pieces waits for its end); calls are parsed at the end."""

    _text: str = ""
    _string_start: int | None = None  # where the response string's characters begin, once known
    _sent: int = 0  # decoded characters of the response already sent

    def feed(self, text: str) -> str:
        self._text += text
        if self._string_start is None:
            opening = _RESPONSE_OPENING.match(self._text)
            if opening is None:
                return ""
            self._string_start = opening.end()
        decoded = _decoded_prefix(self._text[self._string_start:])
        out, self._sent = decoded[self._sent:], len(decoded)
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        content, calls = parse_generic(self._text)
        if calls:
            return "", calls
        return content[self._sent:], []  # what was sent is the start of what parse_generic reads


def _decoded_prefix(body: str) -> str:
    """The characters of a JSON string body (after its opening quote) that are certain: up to the
    closing quote or to an escape (or a surrogate pair) not yet complete."""
    end, i = len(body), 0
    while i < len(body):
        c = body[i]
        if c == '"':
            end = i
            break
        if c != "\\":
            i += 1
            continue
        if i + 1 >= len(body):
            end = i
            break
        if body[i + 1] != "u":
            i += 2
            continue
        if not _HEX.fullmatch(body[i + 2:i + 6]):
            end = i
            break
        if 0xD800 <= int(body[i + 2:i + 6], 16) < 0xDC00 and not _HEX.fullmatch(body[i + 8:i + 12]):
            end = i  # a high surrogate waits for its pair
            break
        i += 6
    try:
        return json.loads('"' + body[:end] + '"')
    except json.JSONDecodeError:
        return ""
