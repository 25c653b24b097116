"""Reading a model's reply: reasoning apart from the answer, and tool calls in each family's format.

Owns: pure functions from generated text to (content, reasoning_content, tool_calls).
Does not own: generation, streaming, the HTTP response shapes (the server builds those from these).

Formats (from each model family's published chat template and tool-calling docs):
* hermes (Qwen 3, Hermes):  <tool_call>{"name": ..., "arguments": {...}}</tool_call>, repeatable
* qwen35 (Qwen 3.5, Qwen3-Coder, LFM3):
      <tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call>
* llama3: a bare JSON object {"name": ..., "parameters": {...}} (optionally after <|python_tag|>)
* mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]  or  [TOOL_CALLS]NAME[ARGS]{...}
* lfm2: <|tool_call_start|>[name(key="value", n=1), ...]<|tool_call_end|>  (Python call syntax)
Malformed calls are left in the content rather than raising: a model's text is never an error.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

TOOL_FORMATS = ("hermes", "qwen35", "llama3", "mistral", "lfm2")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]

    def arguments_json(self) -> str:
        """The arguments as the OpenAI API carries them: a JSON string."""
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class ParsedReply:
    content: str
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


def split_reasoning(text: str, start_tag: str = "<think>", end_tag: str = "</think>",
                    started: bool = False) -> tuple[str | None, str]:
    """(reasoning, content). `started` means the prompt already opened the reasoning block (Qwen 3
    templates end the prompt with <think>), so the reply holds only the closing tag. A block that
    never closes (the reply was cut off) is all reasoning. No block: (None, text)."""
    head = text.lstrip()
    if head.startswith(start_tag):
        started, text = True, head[len(start_tag):]
    if not started:
        return None, text
    reasoning, sep, content = text.partition(end_tag)
    if not sep:
        return reasoning.strip(), ""
    return reasoning.strip(), content.lstrip()


def detect_tool_format(template_source: str | None) -> str | None:
    """Which tool-call format a chat template teaches its model, from the markers it writes."""
    src = template_source or ""
    if "<|tool_call_start|>" in src:
        return "lfm2"
    if "<tool_call>" in src:
        return "qwen35" if "<function=" in src else "hermes"
    if "[TOOL_CALLS]" in src:
        return "mistral"
    if "<|python_tag|>" in src or "ipython" in src:
        return "llama3"
    return None


def parse_tool_calls(text: str, fmt: str, tools: list[dict] | None = None) -> tuple[str, list[ToolCall]]:
    """(content without the calls, calls) for one of TOOL_FORMATS; `tools` (OpenAI tool schemas)
    tells the XML format which parameters are strings."""
    parser = _PARSERS.get(fmt)
    if parser is None:
        raise ValueError(f"unknown tool-call format {fmt!r}; known: {', '.join(TOOL_FORMATS)}")
    return parser(text, tools)


def parse_reply(text: str, tool_format: str | None = None, tools: list[dict] | None = None,
                reasoning_started: bool = False) -> ParsedReply:
    """Reasoning first, then tool calls in what remains."""
    reasoning, content = split_reasoning(text, started=reasoning_started)
    calls: list[ToolCall] = []
    if tool_format is not None:
        content, calls = parse_tool_calls(content, tool_format, tools)
    return ParsedReply(content=content, reasoning_content=reasoning, tool_calls=calls)


# -- one parser per format --------------------------------------------------------------------------


def _call_from_json(obj: Any, args_keys=("arguments", "parameters")) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    for key in args_keys:
        if key in obj:
            args = obj[key]
            if isinstance(args, str):  # some models write the arguments as a JSON string
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    return None
            return ToolCall(obj["name"], args) if isinstance(args, dict) else None
    return ToolCall(obj["name"], {})


def _blocks(text: str, pattern: re.Pattern, read) -> tuple[str, list[ToolCall]]:
    """Replace every block `pattern` finds with nothing when `read` understands it."""
    calls: list[ToolCall] = []
    kept: list[str] = []
    pos = 0
    for m in pattern.finditer(text):
        found = read(m.group(1))
        if found is None:
            continue
        kept.append(text[pos:m.start()])
        calls.extend(found)
        pos = m.end()
    kept.append(text[pos:])
    return ("".join(kept).strip() if calls else text), calls


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def _hermes(text: str, tools) -> tuple[str, list[ToolCall]]:
    def read(body: str):
        try:
            call = _call_from_json(json.loads(body))
        except json.JSONDecodeError:
            return None
        return [call] if call else None

    return _blocks(text, _HERMES, read)


_XML_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.DOTALL)
_XML_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)


def _string_params(tools, name: str) -> set[str]:
    for tool in tools or []:
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        if fn.get("name") == name:
            props = (fn.get("parameters") or {}).get("properties") or {}
            return {k for k, v in props.items() if isinstance(v, dict) and v.get("type") == "string"}
    return set()


def _qwen35(text: str, tools) -> tuple[str, list[ToolCall]]:
    def read(body: str):
        calls = []
        for fm in _XML_FUNCTION.finditer(body):
            name = fm.group(1).strip()
            strings = _string_params(tools, name)
            args: dict[str, Any] = {}
            for pm in _XML_PARAM.finditer(fm.group(2)):
                key, raw = pm.group(1).strip(), pm.group(2)
                args[key] = raw if key in strings else _json_or_text(raw)
            calls.append(ToolCall(name, args))
        return calls or None

    return _blocks(text, _HERMES, read)


def _json_or_text(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _llama3(text: str, tools) -> tuple[str, list[ToolCall]]:
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>"):].strip()
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return text, []
    items = value if isinstance(value, list) else [value]
    calls = [_call_from_json(v, ("parameters", "arguments")) for v in items]
    if not calls or any(c is None for c in calls):
        return text, []
    return "", calls


_MISTRAL_NAMED = re.compile(r"\s*([A-Za-z0-9_.\-]+)\[ARGS\]")


def _mistral(text: str, tools) -> tuple[str, list[ToolCall]]:
    content, sep, rest = text.partition("[TOOL_CALLS]")
    if not sep:
        return text, []
    calls: list[ToolCall] = []
    decoder = json.JSONDecoder()
    for chunk in rest.split("[TOOL_CALLS]"):
        named = _MISTRAL_NAMED.match(chunk)
        try:
            if named:  # v11+: NAME[ARGS]{...}
                args, _ = decoder.raw_decode(chunk[named.end():].lstrip())
                call = ToolCall(named.group(1), args) if isinstance(args, dict) else None
                found = [call] if call else None
            else:  # [{"name": ..., "arguments": {...}}, ...]
                value, _ = decoder.raw_decode(chunk.lstrip())
                items = value if isinstance(value, list) else [value]
                found = [_call_from_json(v) for v in items]
        except json.JSONDecodeError:
            return text, []
        if not found or any(c is None for c in found):
            return text, []
        calls.extend(found)
    return content.strip(), calls


_LFM2 = re.compile(r"<\|tool_call_start\|>(.*?)(?:<\|tool_call_end\|>|$)", re.DOTALL)


def _lfm2(text: str, tools) -> tuple[str, list[ToolCall]]:
    def read(body: str):
        try:
            tree = ast.parse(body.strip(), mode="eval").body
        except SyntaxError:
            return None
        items = tree.elts if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
        calls = []
        for item in items:
            if not isinstance(item, ast.Call) or item.args:
                return None
            name = _dotted(item.func)
            try:  # literal_eval evaluates literals only, never code
                args = {kw.arg: ast.literal_eval(kw.value) for kw in item.keywords if kw.arg}
            except (ValueError, SyntaxError):
                return None
            if name is None:
                return None
            calls.append(ToolCall(name, args))
        return calls or None

    return _blocks(text, _LFM2, read)


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


_PARSERS = {"hermes": _hermes, "qwen35": _qwen35, "llama3": _llama3, "mistral": _mistral, "lfm2": _lfm2}
