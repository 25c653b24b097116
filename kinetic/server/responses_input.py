"""The Responses API's request (responses_api.py) read into the chat request it means, and the
store of earlier responses that previous_response_id continues.

Owns: `input` (a string, or message / function_call / function_call_output items; reasoning items
skipped; images, files and item references refused), `instructions` (the system message, not
carried to a later response), function `tools` made OpenAI's nested ones, `tool_choice`,
`text.format` as response_format, `max_output_tokens` and the sampler fields; and ResponseStore:
the last STORED responses with their conversations (least recently used out), read on the CpuPool
and written on the event loop. Does not own the response's shapes (responses_api.py).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass

from kinetic.runtime.sampling.settings import LIMITS
from kinetic.server.body import Fields
from kinetic.server.errors import ApiError, not_supported

STORED = 128  # responses kept for previous_response_id (each holds its conversation: at most a context)


@dataclass(frozen=True)
class Stored:
    messages: list[dict]  # the conversation, this response's answer last (instructions left out)
    response: dict


class ResponseStore:
    """Responses by id, the least recently used dropped past `size`. Read on the CpuPool, written on
    the event loop: a lock keeps them apart."""

    def __init__(self, size: int = STORED):
        self.size = size
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Stored | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: str, item: Stored) -> None:
        with self._lock:
            self._items[key] = item
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


# -- the request --------------------------------------------------------------------------------------------

PASSED_ON = (*LIMITS, "seed", "stream", "parallel_tool_calls")  # the same meaning on /v1/chat/completions
TEXT_PARTS = ("input_text", "output_text", "text")


@dataclass(frozen=True)
class Asked:
    """What the request asked, kept to answer with: the chat body and the fields the response echoes."""

    body: dict
    history: list[dict]  # the conversation without instructions (what a later response continues)
    echo: dict


def read_request(f: Fields, store: ResponseStore) -> Asked:
    history = _previous(f, store) + _input(f)
    instructions = f.string("instructions")
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + history
    body: dict = {name: f.raw(name) for name in PASSED_ON if f.has(name)}
    body["messages"] = messages
    max_tokens = f.integer("max_output_tokens", lo=1)
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    tools = _tools(f)
    if tools:
        body["tools"] = tools
    if f.has("tool_choice"):
        body["tool_choice"] = _tool_choice(f)
    text = f.obj("text") or {}
    if text.get("format") is not None:
        body["response_format"] = _format(Fields(text, "text.").obj("format"))
    echo = {"instructions": instructions, "max_output_tokens": max_tokens,
            "previous_response_id": f.string("previous_response_id"), "tools": f.raw("tools", []),
            "tool_choice": f.raw("tool_choice", "auto"), "parallel_tool_calls": bool(f.raw("parallel_tool_calls")),
            "temperature": f.raw("temperature"), "top_p": f.raw("top_p"),
            "text": {"format": text.get("format") or {"type": "text"}}, "metadata": f.raw("metadata", {}),
            "store": f.boolean("store", True), "truncation": "disabled", "reasoning": {"effort": None, "summary": None},
            "error": None, "user": None}
    return Asked(body, history, echo)


def _previous(f: Fields, store: ResponseStore) -> list[dict]:
    key = f.string("previous_response_id")
    if key is None:
        return []
    found = store.get(key)
    if found is None:
        raise ApiError(404, f"Previous response with id '{key}' not found (responses are kept in this server's "
                            f"memory, the last {store.size}, until it stops).", param="previous_response_id",
                       extra={"code": "previous_response_not_found"})
    return list(found.messages)


def _input(f: Fields) -> list[dict]:
    value = f.raw("input")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise f.bad("input", "a string or a non-empty list of input items")
    names: dict[str, str] = {}  # call_id -> the function's name, for the outputs that answer it
    out: list[dict] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            out.append(_message(item, where))
        elif kind == "function_call":
            _add_call(out, item, where, names)
        elif kind == "function_call_output":
            out.append(_call_output(item, where, names))
        elif kind == "reasoning":
            continue
        else:
            raise ApiError(400, f"{where} must be a message, function_call or function_call_output item, not "
                                f"{json.dumps(kind)[:40]}", param=where)
    return out


def _message(item: dict, where: str) -> dict:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise ApiError(400, f"{where}.role must be user, assistant, system or developer", param=f"{where}.role")
    return {"role": role, "content": _text(item.get("content"), f"{where}.content")}


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where} must be a string or a list of input_text parts", param=where)
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in ("input_image", "input_file", "input_audio"):
            raise not_supported(f"{where}[{i}] ({kind})", ": this server has no vision model", param=f"{where}[{i}]")
        else:
            raise ApiError(400, f"{where}[{i}] must be an input_text part with a text string", param=f"{where}[{i}]")
    return "\n".join(texts)


def _add_call(out: list[dict], item: dict, where: str, names: dict[str, str]) -> None:
    """A function_call item joins the assistant message before it, or starts one."""
    name, call_id = item.get("name"), str(item.get("call_id", ""))
    if not isinstance(name, str) or not name:
        raise ApiError(400, f"{where}.name must be the function's name", param=f"{where}.name")
    names[call_id] = name
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": item.get("arguments", "{}")}}
    if out and out[-1]["role"] == "assistant":
        out[-1] = {**out[-1], "tool_calls": [*out[-1].get("tool_calls", []), call]}
    else:
        out.append({"role": "assistant", "content": "", "tool_calls": [call]})


def _call_output(item: dict, where: str, names: dict[str, str]) -> dict:
    call_id = str(item.get("call_id", ""))
    output = item.get("output", "")
    message = {"role": "tool", "tool_call_id": call_id,
               "content": output if isinstance(output, str) else _text(output, f"{where}.output")}
    if call_id in names:
        message["name"] = names[call_id]
    return message


def _tools(f: Fields) -> list[dict]:
    tools = []
    for i, tool in enumerate(f.array("tools") or []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise not_supported(f"tools[{i}] of type {json.dumps(kind)[:40]}", ": only function tools",
                                param=f"tools[{i}]")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise ApiError(400, f"tools[{i}] must have a name", param=f"tools[{i}].name")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(f: Fields):
    choice = f.raw("tool_choice")
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise f.bad("tool_choice", '"auto", "none", "required" or {"type": "function", "name": ...}')


def _format(fmt: dict) -> dict:
    """text.format (flat) as response_format (json_schema's fields nested)."""
    if fmt.get("type") != "json_schema":
        return fmt
    return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
