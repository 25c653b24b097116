"""Constrained output in the server: which grammar a request asks for, compiled once and cached.

Owns: reading the grammar fields of the three APIs into one GrammarSpec (OpenAI's response_format,
llama-server's grammar and json_schema on both its route and the OpenAI ones, Ollama's format,
forced tool calls), refusing requests that ask for two, and GrammarCache: the model's TokenVocab
(built on the first constrained request: 0.5-2 s) and the compiled GrammarMatchers, a small LRU
keyed by what the request sent. A grammar or schema kinetic.grammar cannot compile is a 400 naming
the field with GrammarError's message.
Does not own: GBNF, JSON Schema and tool-call grammars (kinetic/grammar), applying the mask
(ConstrainedSampler on the engine thread), parsing tool calls back (reply.py).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from kinetic.grammar import (
    Grammar,
    GrammarError,
    GrammarMatcher,
    TokenVocab,
    json_schema_grammar,
    parse_gbnf,
    tool_call_grammar,
)
from kinetic.server.body import Fields
from kinetic.server.errors import ApiError
from kinetic.server.generic_tools import generic_schema

MATCHERS_KEPT = 16  # compiled grammars kept; each keeps the automaton states and masks it has built


@dataclass(frozen=True)
class GrammarSpec:
    """A grammar a request asked for, not compiled yet: the field that asked (named in errors), a
    key for the cache (what the request sent, canonical), and how to build it."""

    field: str
    key: str
    build: Callable[[], Grammar]
    schema: object = None  # the JSON Schema it holds to, when it is one (the generic tool fallback reuses it)


def _gbnf(field: str, text: str) -> GrammarSpec:
    return GrammarSpec(field, "gbnf:" + text, lambda: parse_gbnf(text))


ANY_OBJECT = {"type": "object"}


def _schema(field: str, schema) -> GrammarSpec:
    """A JSON Schema's grammar; an empty schema means any JSON object, as llama.cpp reads it
    (tools/server: "an absent or empty schema means any object"), on every route."""
    if isinstance(schema, dict) and not schema:
        schema = ANY_OBJECT
    key = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True, ensure_ascii=False)
    return GrammarSpec(field, "schema:" + key, lambda: json_schema_grammar(schema), schema=_parsed(schema))


def _parsed(schema):
    """A schema sent as JSON text, as an object where it parses (compiling reports it otherwise)."""
    if not isinstance(schema, str):
        return schema
    try:
        return json.loads(schema)
    except (json.JSONDecodeError, RecursionError):
        return schema


def _only_one(specs: list[GrammarSpec], what: str) -> GrammarSpec | None:
    if len(specs) > 1:
        raise ApiError(400, f"{what} can be used one at a time, not together (this request sets "
                            f"{' and '.join(s.field for s in specs)})", param=specs[1].field)
    return specs[0] if specs else None


def _extensions(f: Fields) -> list[GrammarSpec]:
    """llama-server's grammar (GBNF text) and json_schema (a JSON Schema) fields."""
    specs = []
    text = f.string("grammar")
    if text:
        specs.append(_gbnf("grammar", text))
    schema = f.raw("json_schema")
    if schema is not None:
        if not isinstance(schema, (dict, bool, str)):
            raise f.bad("json_schema", "a JSON Schema object")
        specs.append(_schema("json_schema", schema))
    return specs


def openai_grammar(f: Fields) -> GrammarSpec | None:
    """response_format {"type": "json_object"} (a JSON object, as llama.cpp and OpenAI; with
    "schema", that schema), {"type": "json_schema", "json_schema": {"schema": ...}} (a missing or
    empty schema: any object), or llama-server's grammar and json_schema fields; at most one."""
    specs = []
    fmt = f.obj("response_format")
    if fmt is not None:
        kind = fmt.get("type")
        if kind == "json_object":
            specs.append(_schema("response_format", fmt.get("schema") or {}))
        elif kind == "json_schema":
            wrapper = Fields(fmt, "response_format.").obj("json_schema") or {}
            specs.append(_schema("response_format", wrapper.get("schema") or {}))
        elif kind != "text":
            raise ApiError(400, "response_format.type must be text, json_object or json_schema", "response_format")
    return _only_one(specs + _extensions(f), "grammar, json_schema and response_format")


def llama_grammar(f: Fields) -> GrammarSpec | None:
    """/completion's grammar or json_schema."""
    return _only_one(_extensions(f), "grammar and json_schema")


def ollama_grammar(f: Fields) -> GrammarSpec | None:
    """format: "json" (a JSON object, as Ollama's own grammar) or a JSON Schema."""
    fmt = f.raw("format")
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return _schema("format", ANY_OBJECT)
    if not isinstance(fmt, dict):
        raise f.bad("format", '"json" or a JSON Schema object')
    return _schema("format", fmt)


def tool_grammar(tools: list[dict], style: str, parallel: bool, only: str | None, think: str | None) -> GrammarSpec:
    """A reply made of tool calls in the template's format (tool_choice required or a named function)."""
    key = json.dumps([style, parallel, only, think, tools], sort_keys=True, ensure_ascii=False)
    return GrammarSpec("tool_choice", "tools:" + key,
                       lambda: tool_call_grammar(tools, style, parallel, only=only, think=think))


def generic_tool_grammar(tools: list[dict], parallel: bool, response: GrammarSpec | None) -> GrammarSpec:
    """The generic fallback's reply: a tool call or a response (generic_tools.py); a response_format
    or json_schema the request set holds the response. A GBNF grammar cannot be combined (400)."""
    if response is not None and response.schema is None:
        raise ApiError(400, f"{response.field} (a GBNF grammar) cannot be combined with tools on a chat template "
                            "without a tool-call format: the reply is held to JSON naming a tool call or a response",
                       param=response.field)
    schema = generic_schema(tools, parallel=parallel, response=None if response is None else response.schema)
    key = json.dumps(schema, sort_keys=True, ensure_ascii=False)
    return GrammarSpec("tools", "generic:" + key, lambda: json_schema_grammar(schema), schema=schema)


class GrammarCache:
    """The model's vocabulary as the matcher sees it, built on first use, and compiled grammars (LRU).
    Called from request threads; matchers are thread-safe and shared by every request using them."""

    def __init__(self, model, size: int = MATCHERS_KEPT):
        self.model = model
        self.size = size
        self._vocab: TokenVocab | None = None
        self._matchers: OrderedDict[str, GrammarMatcher] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def vocab(self) -> TokenVocab:
        if self._vocab is None:
            self._vocab = TokenVocab.from_tokenizer(self.model.tokenizer)
        return self._vocab

    def matcher(self, spec: GrammarSpec) -> GrammarMatcher:
        """The compiled grammar of `spec`; ApiError 400 naming the field when it does not compile."""
        with self._lock:
            found = self._matchers.get(spec.key)
            if found is not None:
                self._matchers.move_to_end(spec.key)
                return found
            try:
                matcher = GrammarMatcher(spec.build(), self.vocab)
            except GrammarError as e:
                hint = f". {e.hint}" if e.hint else ""
                raise ApiError(400, f"{spec.field}: {e.message}{hint}", param=spec.field) from None
            except RecursionError:
                raise ApiError(400, f"{spec.field}: the grammar nests too deeply", param=spec.field) from None
            self._matchers[spec.key] = matcher
            if len(self._matchers) > self.size:
                self._matchers.popitem(last=False)
            return matcher

    def __len__(self) -> int:
        return len(self._matchers)


def compile_grammar(cache: GrammarCache, spec: GrammarSpec | None) -> GrammarMatcher | None:
    """The matcher for `spec` (None for none). Called inside a request's CpuPool work (offload.py),
    so the event loop never waits on a compile."""
    return None if spec is None else cache.matcher(spec)
