"""Prompts from requests: chat messages through the model's template, text and token ids.

Owns: validating OpenAI-style messages (string content or text parts; tool calls and results passed
to the template), rendering them, tokenizing as `kinetic run` does (special tokens parsed, so a
greedy answer through the server equals Model.generate on the same prompt), and refusing prompts
the context cannot hold. Also what the template teaches the model: whether it reasons in a <think>
block and which tool-call format it writes, and the generic fallback's prompt for templates that
write none (generic_tools.py). Does not own sampling or response shapes.

Everything here is synchronous and CPU-bound: the API modules call it inside their CpuPool work
(offload.py), never on the event loop. A text whose byte length already proves it cannot fit the
context is refused before it is tokenized (fit.py); the exact count is checked after.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace

from kinetic.errors import KineticError
from kinetic.frontend.output_parsing import detect_tool_format
from kinetic.frontend.template_pool import RenderCancelled
from kinetic.server.body import Fields
from kinetic.server.errors import ApiError, ContextExceeded, context_exceeded, not_supported
from kinetic.server.generic_tools import messages_with_tools
from kinetic.server.offload import Cancel, ClientGone
from kinetic.server.options import ServerState
from kinetic.server.textstream import THINK_CLOSE, THINK_OPEN

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_TOOLS = 128
GENERIC = "generic"  # the tool_format of a prompt in the generic fallback (generic_tools.py)


@dataclass(frozen=True)
class ChatPrompt:
    ids: tuple[int, ...]
    text: str
    reasoning_started: bool  # the prompt ends inside an open <think> block
    thinks: bool  # the template knows <think> blocks
    tool_format: str | None  # set when tools were offered and the template has a call format
    forced_calls: bool = False  # tool_choice forced calls: the whole reply (after reasoning) is calls


def messages_from(f: Fields, name: str = "messages") -> list[dict]:
    """OpenAI messages -> the dicts chat templates read (content as a string)."""
    value = f.raw(name)
    if value is None:
        raise ApiError(400, f"{name} is required", param=name)
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"{name} must be a non-empty list of messages", param=name)
    return [_message(m, f"{name}[{i}]") for i, m in enumerate(value)]


def _message(m, where: str) -> dict:
    if not isinstance(m, dict):
        raise ApiError(400, f"{where} must be an object with role and content", param=where)
    role = m.get("role")
    if role not in ROLES:
        raise ApiError(400, f"{where}.role must be one of {', '.join(ROLES)}, not {json.dumps(role)[:40]}",
                       param=f"{where}.role")
    out = {"role": "system" if role == "developer" else role, "content": _content(m.get("content"), where)}
    calls = m.get("tool_calls")
    if calls is not None:
        out["tool_calls"] = _tool_calls(calls, f"{where}.tool_calls")
    for key in ("tool_call_id", "name"):
        if isinstance(m.get(key), str):
            out[key] = m[key]
    if isinstance(m.get("reasoning_content"), str):
        out["reasoning_content"] = m["reasoning_content"]
    if m.get("images"):
        raise not_supported(f"{where}.images", ": this server has no vision model")
    return out


def _content(content, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise ApiError(400, f"{where}.content must be a string or a list of parts", param=f"{where}.content")
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in ("image_url", "input_image", "input_audio"):
            raise not_supported(f"{where}.content[{i}] ({kind})", ": this server has no vision model (--mmproj)")
        else:
            raise ApiError(400, f"{where}.content[{i}] must be a part of type text with a text string",
                           param=f"{where}.content[{i}]")
    return "\n".join(texts)


def _tool_calls(calls, where: str) -> list[dict]:
    """Tool calls sent back in an assistant message; arguments become objects, as templates expect."""
    if not isinstance(calls, list):
        raise ApiError(400, f"{where} must be a list", param=where)
    out = []
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ApiError(400, f"{where}[{i}] must have function.name", param=f"{where}[{i}]")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except (json.JSONDecodeError, RecursionError):
                pass  # templates get the string as it came
        out.append({"id": call.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def tools_from(f: Fields) -> list[dict] | None:
    value = f.array("tools")
    if not value:
        return None
    if len(value) > MAX_TOOLS:
        raise f.bad("tools", f"a list of at most {MAX_TOOLS} tools")
    for i, tool in enumerate(value):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ApiError(400, f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                           param=f"tools[{i}]")
    return value


def template_kwargs(f: Fields, name: str = "chat_template_kwargs") -> dict:
    value = f.obj(name) or {}
    reserved = {"messages", "tools", "add_generation_prompt"} & set(value)
    if reserved:
        raise ApiError(400, f"{name} cannot set {', '.join(sorted(reserved))}", param=name)
    return value


def chat_prompt(state: ServerState, messages: list[dict], tools: list[dict] | None, kwargs: dict,
                cancel: Cancel | None = None) -> ChatPrompt:
    """Render (in the template's renderer process, stopped when `cancel` says the client left or the
    server is stopping) and tokenize."""
    template = state.model.chat_template
    try:
        text = template.render_cancellable(messages, cancel=cancel, tools=tools, template_kwargs=kwargs)
    except RenderCancelled:
        raise ClientGone() from None
    except KineticError as e:
        raise ApiError(400, e.message, param="messages") from None
    source = template.source
    thinks = THINK_OPEN in source and THINK_CLOSE in source
    started = thinks and text.rstrip().endswith(THINK_OPEN)
    fmt = detect_tool_format(source) if tools else None
    return ChatPrompt(text_prompt(state, text), text, started, thinks, fmt)


def template_tool_format(state: ServerState) -> str | None:
    """The tool-call format the model's template teaches (None: the template has no place for tools)."""
    return detect_tool_format(state.model.chat_template.source)


def generic_tools_prompt(state: ServerState, messages: list[dict], tools: list[dict], kwargs: dict,
                         cancel: Cancel | None = None) -> ChatPrompt:
    """The generic fallback's prompt: the tools described in the system message, earlier calls and
    results in its JSON; 400 "MODEL does not support tools" when the template cannot render that."""
    try:
        prompt = chat_prompt(state, messages_with_tools(messages, tools), None, kwargs, cancel)
    except ContextExceeded:
        raise
    except ApiError as e:
        raise ApiError(400, f"{state.name} does not support tools: its chat template has no tool-call format and "
                            f"cannot render the system message that describes the tools ({e.message})",
                       param="tools") from None
    return replace(prompt, tool_format=GENERIC)


def fitted_chat_prompt(render: Callable[[list[dict]], ChatPrompt], messages: list[dict], window: int,
                       truncate: bool) -> ChatPrompt:
    """render(messages) when the prompt fits `window` tokens (leaving one for the answer). With
    `truncate`, as Ollama's chatPrompt: the oldest messages are dropped one at a time, system
    messages and the last message always kept, until it fits; otherwise, or when even the last
    message alone does not fit, the context error names `window`."""
    start = 0
    while True:
        kept = [m for m in messages[:start] if m["role"] == "system"] + messages[start:]
        try:
            prompt = render(kept)
            if len(prompt.ids) < window:
                return prompt
            error = context_exceeded(len(prompt.ids), window)
        except ContextExceeded as e:  # refused for the server's own context, maybe from its byte length
            error = context_exceeded(e.extra["n_prompt_tokens"], window, at_least=e.count.startswith("at least"))
        if not truncate or start >= len(messages) - 1:
            raise error
        start += 1


def text_prompt(state: ServerState, text: str) -> tuple[int, ...]:
    """`text` tokenized as `kinetic run` does, refused unread when its bytes cannot fit the context."""
    state.token_bound.refuse_oversized(state.token_bound.fewest_tokens(text), state.n_ctx)
    return check_ids(state, tokenize(state, text))


def tokenize(state: ServerState, text: str, add_special: bool = True) -> list[int]:
    return state.model.tokenize(text, add_special=add_special, parse_special=True)


def check_ids(state: ServerState, ids: list) -> tuple[int, ...]:
    """Token ids that fit the context and the vocabulary, as a prompt."""
    n_vocab, n_ctx = state.model.n_vocab, state.n_ctx
    if not ids:
        raise ApiError(400, "the prompt is empty", param="prompt")
    if len(ids) >= n_ctx:
        raise context_exceeded(len(ids), n_ctx)
    bad = [t for t in ids if not 0 <= t < n_vocab]
    if bad:
        raise ApiError(400, f"token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})", param="prompt")
    return tuple(int(t) for t in ids)
