"""Grammars that hold a reply to tool calls in the chat template's own call format.

Owns: `tool_call_grammar(tools, style, parallel)` for `tool_choice: "required"` and a named
function (`only=`), in the formats kinetic.frontend.output_parsing reads back:
* hermes (Qwen 3, Hermes):  <tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>
* qwen35 (Qwen 3.5, Qwen3-Coder, LFM3): <tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n
  </parameter>\\n...</function>\\n</tool_call> (parameter names from the schema, in its order,
  required ones present; values free text that cannot close the block early)
* llama3: a bare {"name": "NAME", "parameters": {...}} (a JSON list of them when parallel)
* mistral: [TOOL_CALLS][{"name": "NAME", "arguments": {...}}, ...]
* lfm2: <|tool_call_start|>[NAME(key=VALUE, ...), ...]<|tool_call_end|>, Python call syntax
  with Python literals (True, False, None), which is what LFM2 writes and output_parsing reads
Arguments follow each tool's `parameters` JSON Schema (json_schema.py). One call unless
`parallel`; `think="optional"` lets a template that knows <think> reason in a whole block first,
`think="open"` closes a block the prompt opened.
Does not own: choosing the style from a template (output_parsing.detect_tool_format), parsing
replies, prompts.
"""

from __future__ import annotations

import json
from typing import Any

from kinetic.grammar.gbnf import parse_gbnf
from kinetic.grammar.gbnf_ast import Grammar, GrammarError
from kinetic.grammar.json_objects import members
from kinetic.grammar.json_schema import SchemaRules
from kinetic.grammar.json_text import literal

TOOL_STYLES = ("hermes", "qwen35", "llama3", "mistral", "lfm2")
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}
_HINT = 'Tools follow the OpenAI format: {"type": "function", "function": {"name": ..., "parameters": {...}}}.'


def _functions(tools: Any, only: str | None) -> list[tuple[str, Any]]:
    """(name, parameters schema) per tool, checked; just the named one when `only` is given."""
    if not isinstance(tools, list) or not tools:
        raise GrammarError("a forced tool call needs a non-empty list of tools", _HINT)
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise GrammarError(f"tools[{i}] has no function name", _HINT)
        params = fn.get("parameters")
        out.append((name, _EMPTY_PARAMETERS if params is None else params))
    if only is not None:
        out = [f for f in out if f[0] == only]
        if not out:
            names = ", ".join(repr(t[0]) for t in _functions(tools, None))
            raise GrammarError(f"tool_choice names the function {only!r}, which is not among the tools ({names})",
                               _HINT)
    return out


def text_without(rules: SchemaRules, forbidden: list[str], name: str) -> str:
    """A rule for any text (possibly empty) that contains none of `forbidden`: one rule per
    state of the automaton that tracks the longest suffix that could start a forbidden string."""
    prefixes = sorted({f[:i] for f in forbidden for i in range(len(f))}, key=lambda p: (len(p), p))
    alphabet = sorted(set("".join(forbidden)))
    names = {p: f"{name}-{i}" for i, p in enumerate(prefixes)}

    def step(state: str, c: str) -> str | None:
        s = state + c
        if any(s.endswith(f) for f in forbidden):
            return None
        while s not in names:
            s = s[1:]
        return s

    other = "".join("\\" + c if c in "]-\\^[" else c for c in alphabet)
    for prefix in prefixes:
        alts = ['""', f"[^{other}] {names['']}"]
        for c in alphabet:
            nxt = step(prefix, c)
            if nxt is not None:
                alts.append(f"{literal(c)} {names[nxt]}")
        rules.rules[names[prefix]] = " | ".join(alts)
    return names[""]


def _json_call(rules: SchemaRules, name: str, params: Any, index: int, args_key: str) -> str:
    rules.document = params
    args = rules.visit(params, f"call{index}-args", f"tools[{index}].function.parameters")
    space = rules.primitive("space")
    return rules.add_rule(
        f"call{index}",
        f'"{{" {space} "\\"name\\"" {space} ":" {space} {literal(json.dumps(name, ensure_ascii=False))} '
        f'"," {space} {literal(json.dumps(args_key))} {space} ":" {space} {args} {space} "}}"')


def _xml_call(rules: SchemaRules, name: str, params: Any, index: int, value: str) -> str:
    if not isinstance(params, dict):
        raise GrammarError(f"tools[{index}].function.parameters must be a JSON Schema object", _HINT)
    props = params.get("properties") or {}
    required = params.get("required") or []
    entries = []
    for key in props:
        param = rules.add_rule(f"call{index}-{key}", f'{literal(f"<parameter={key}>")} "\\n" {value} '
                                                     f'"\\n</parameter>\\n"')
        entries.append(param if key in required else f"{param}?")
    head = literal(f"<tool_call>\n<function={name}>\n")
    return rules.add_rule(f"call{index}", " ".join([head, *entries, literal("</function>\n</tool_call>")]))


def _python_call(rules: SchemaRules, name: str, params: Any, index: int) -> str:
    if not all(part.isidentifier() for part in name.split(".")):
        raise GrammarError(f"the function name {name!r} cannot be written as a Python call (LFM2's format)")
    if not isinstance(params, dict):
        raise GrammarError(f"tools[{index}].function.parameters must be a JSON Schema object", _HINT)
    rules.document = params
    props = params.get("properties") or {}
    required = params.get("required") or []
    entries = []
    for key, schema in props.items():
        if not key.isidentifier():
            raise GrammarError(f"the parameter {key!r} of {name!r} cannot be a Python keyword argument")
        value = rules.visit(schema, f"call{index}-{key}", f"tools[{index}].function.parameters.properties.{key}")
        entries.append((rules.add_rule(f"call{index}-{key}-kv", f'"{key}=" {value}'), key in required))
    body = members(rules, entries, None, f"call{index}", separator=f'"," {rules.primitive("space")}') if entries else ""
    return rules.add_rule(f"call{index}", f'{literal(name + "(")} {body} ")"')


def tool_call_grammar(tools: Any, style: str | None, parallel: bool = False, *, only: str | None = None,
                      think: str | None = None) -> Grammar:
    """The grammar of a reply made of tool calls in `style` (one of TOOL_STYLES, as
    output_parsing.detect_tool_format names them). `only` restricts it to one named function
    (tool_choice {"type": "function", ...}); `parallel` allows several calls; `think` is None,
    "optional" (a whole <think>...</think> block may come first) or "open" (the prompt opened one:
    reasoning text, then </think>)."""
    if style is None:
        raise GrammarError("the chat template's tool-call format is not known, so a tool call cannot be forced",
                           "Use a model whose template writes tool calls in a known format "
                           f"({', '.join(TOOL_STYLES)}), or pass --chat-template-file.")
    if style not in TOOL_STYLES:
        raise GrammarError(f"unknown tool-call format {style!r}; known: {', '.join(TOOL_STYLES)}")
    if think not in (None, "optional", "open"):
        raise GrammarError(f"think must be None, 'optional' or 'open', not {think!r}")
    functions = _functions(tools, only)
    rules = SchemaRules(python_literals=style == "lfm2")
    space = rules.primitive("markup-space")  # between markers and calls; compact `space` inside the JSON
    if style == "qwen35":
        value = text_without(rules, ["</parameter>", "<parameter=", "</function>", "</tool_call>"], "value")
        calls = [_xml_call(rules, n, p, i, value) for i, (n, p) in enumerate(functions)]
    elif style == "lfm2":
        calls = [_python_call(rules, n, p, i) for i, (n, p) in enumerate(functions)]
    else:
        key = "parameters" if style == "llama3" else "arguments"
        calls = [_json_call(rules, n, p, i, key) for i, (n, p) in enumerate(functions)]
    call = rules.add_rule("call", " | ".join(calls))
    if style == "hermes":
        one = rules.add_rule("tool-call", f'"<tool_call>" {space} {call} {space} "</tool_call>"')
        body = f"{one} ({space} {one})*" if parallel else one
    elif style == "qwen35":
        body = f"{call} ({space} {call})*" if parallel else call
    elif style == "llama3":
        gap = rules.primitive("space")
        body = f'{call} | "[" {gap} {call} ("," {gap} {call})* {gap} "]"' if parallel else call
    else:
        items = f'{call} ("," {rules.primitive("space")} {call})*' if parallel else call
        body = f'"[TOOL_CALLS][" {items} "]"' if style == "mistral" else \
            f'"<|tool_call_start|>[" {items} "]<|tool_call_end|>"'
    if think is not None:
        reasoning = text_without(rules, ["</think>"], "reasoning")
        block = f'"<think>" {reasoning} "</think>" {space}'
        prefix = f"({block})?" if think == "optional" else f'{reasoning} "</think>" {space}'
        body = f"{prefix} ({body})"
    return parse_gbnf(rules.text(body))
