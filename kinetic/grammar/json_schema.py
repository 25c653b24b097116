"""JSON Schema to GBNF: the subset llama.cpp converts, with errors where llama.cpp skips silently.

Owns: `json_schema_to_gbnf(schema)` (text), `json_schema_grammar(schema)` (a parsed Grammar),
`json_object_grammar()` (any JSON value, for response_format json_object), and `SchemaRules`, the
builder tool_calls.py reuses. Supported: type (object, array, string, number, integer, boolean,
null, or a list of them), properties / required / additionalProperties (false when the object has
properties and does not say, as in llama.cpp), enum, const, anyOf / oneOf (oneOf's "only one" is not
enforced), allOf of objects, items / prefixItems / minItems / maxItems, minLength / maxLength,
pattern (regex.py), format date / time / date-time / uuid, integer minimum / maximum (exclusive
too), $ref into the same document ($defs, definitions, any JSON pointer; recursion allowed),
nullable. Annotations (title, description, default, examples, unknown formats, ...) and unknown
keywords are ignored, as JSON Schema says; validation keywords that cannot be held to raise a
GrammarError naming them and where they are.
Does not own: object members and key exclusion (json_objects.py), matching (matcher.py), tool-call
formats (tool_calls.py).

Output shape: a value has no whitespace around it; inside objects and arrays `space` (none or one
space: compact JSON, a subset of what llama.cpp allows) may follow `{ [ , :` and a key and come
before `} ]`, at the places llama.cpp's grammars put it; the object's properties come in the
schema's order.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote

from kinetic.grammar.gbnf import parse_gbnf
from kinetic.grammar.gbnf_ast import MAX_REPETITION, Grammar, GrammarError
from kinetic.grammar.json_objects import object_rule
from kinetic.grammar.json_text import (
    BOUNDS,
    PRIMITIVES,
    PYTHON_PRIMITIVES,
    integer_bounds,
    integer_range,
    literal,
    repetition,
)
from kinetic.grammar.regex import pattern_to_gbnf

_HINT = "Kinetic supports the JSON Schema subset described in docs/grammar.md."

_FORMATS = {"date": "date-string", "time": "time-string", "date-time": "date-time-string", "uuid": "uuid"}

_UNSUPPORTED = (
    "not", "if", "then", "else", "dependentSchemas", "dependentRequired", "dependencies", "patternProperties",
    "propertyNames", "minProperties", "maxProperties", "contains", "minContains", "maxContains", "multipleOf",
    "unevaluatedProperties", "unevaluatedItems", "$anchor", "$dynamicRef", "$dynamicAnchor", "$recursiveRef",
    "$recursiveAnchor",
)
_VALIDATION = {
    "type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "properties", "required", "additionalProperties",
    "items", "prefixItems", "minItems", "maxItems", "uniqueItems", "minLength", "maxLength", "pattern", "format",
    "nullable", *BOUNDS, *_UNSUPPORTED,
}
_TYPE_KEYWORDS = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "prefixItems", "minItems", "maxItems", "uniqueItems"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "integer": set(BOUNDS),
    "number": set(BOUNDS),
}


def _rule_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9-]+", "-", name).strip("-") or "anon"


class SchemaRules:
    """Builds GBNF rules from schemas; `visit(schema, name)` returns the name of the rule matching
    it, `text(root_body)` the whole grammar."""

    def __init__(self, document: Any = None, *, python_literals: bool = False):
        self.document = document
        self.python_literals = python_literals
        self.rules: dict[str, str | None] = {}
        self._refs: dict[tuple[int, str], str] = {}

    # -- rules

    def primitive(self, name: str) -> str:
        table = {**PRIMITIVES, **PYTHON_PRIMITIVES} if self.python_literals else PRIMITIVES
        body, deps = table[name]
        if name not in self.rules:
            self.rules[name] = body
            for dep in deps:
                self.primitive(dep)
        return name

    def add_rule(self, name: str, body: str) -> str:
        """Add `name ::= body` (a fresh name when taken by another body); returns the name used."""
        base = _rule_name(name)
        if base in PRIMITIVES:
            base += "-"
        candidate, n = base, 1
        while candidate in self.rules and self.rules[candidate] != body:
            candidate, n = f"{base}{n}", n + 1
        self.rules[candidate] = body
        return candidate

    def text(self, root_body: str | None = None) -> str:
        if root_body is not None:
            self.rules = {"root": root_body, **{k: v for k, v in self.rules.items() if k != "root"}}
        return "".join(f"{name} ::= {body}\n" for name, body in self.rules.items())

    def literal_value(self, value: Any) -> str:
        """GBNF for exactly one JSON (or Python-literal) value, written compactly."""
        return literal(self._dump(value))

    def _dump(self, value: Any) -> str:
        if self.python_literals:
            if value is True or value is False or value is None:
                return {True: "True", False: "False", None: "None"}[value]
            if isinstance(value, list):
                return "[" + ",".join(self._dump(v) for v in value) + "]"
            if isinstance(value, dict):
                return "{" + ",".join(f"{json.dumps(str(k), ensure_ascii=False)}:{self._dump(v)}"
                                      for k, v in value.items()) + "}"
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    # -- schemas

    def error(self, where: str, problem: str) -> GrammarError:
        return GrammarError(f"schema error at {where}: {problem}", _HINT)

    def visit(self, schema: Any, name: str, where: str = "#") -> str:
        """The name of a rule matching exactly the values `schema` accepts."""
        if isinstance(schema, dict) and "$ref" in schema:
            self._check_keywords(schema, where)
            return self._ref(schema["$ref"], where)
        return self.add_rule(name, self.body(schema, name, where))

    def body(self, schema: Any, name: str, where: str) -> str:
        if schema is True:
            return self.primitive("value")
        if schema is False:
            raise self.error(where, "the schema false matches nothing")
        if not isinstance(schema, dict):
            raise self.error(where, f"a schema must be an object or a boolean, not {type(schema).__name__}")
        self._check_keywords(schema, where)
        if "$ref" in schema:
            return self._ref(schema["$ref"], where)
        if "const" in schema:
            return self.literal_value(schema["const"])
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise self.error(where, "'enum' must be a non-empty list")
            return " | ".join(self.literal_value(v) for v in values)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self._union(schema[key], key, name, where)
        if "allOf" in schema:
            return self._all_of(schema["allOf"], name, where)
        if schema.get("nullable") is True:
            rest = {k: v for k, v in schema.items() if k != "nullable"}
            return f"{self.visit(rest, name + '-value', where)} | {self.primitive('null')}"
        kind = schema.get("type")
        if isinstance(kind, list):
            if not kind:
                raise self.error(where, "'type' is an empty list")
            alts = [self.visit({**schema, "type": t}, f"{name}-{t}", where) for t in kind]
            return " | ".join(alts)
        if kind is None:
            kind = self._implied_type(schema)
        return self._typed(schema, kind, name, where)

    def _check_keywords(self, schema: dict, where: str) -> None:
        bad = [k for k in _UNSUPPORTED if k in schema]
        if schema.get("uniqueItems") is True:
            bad.append("uniqueItems")
        if bad:
            raise self.error(where, f"{', '.join(repr(k) for k in bad)} {'is' if len(bad) == 1 else 'are'} "
                                    "not supported")
        combined = [k for k in ("$ref", "anyOf", "oneOf", "allOf", "const", "enum") if k in schema]
        if combined:
            others = sorted(k for k in schema if k in _VALIDATION and k not in combined and k not in ("type", "format"))
            if others or len(combined) > 1 and not set(combined) <= {"const", "enum"}:
                keys = ", ".join(repr(k) for k in combined + others)
                raise self.error(where, f"combining {keys} in one schema is not supported")

    def _implied_type(self, schema: dict) -> str | None:
        """The type keywords imply when the schema names none (bounds imply a number)."""
        for kind in ("object", "array", "string", "number"):
            if _TYPE_KEYWORDS[kind] & schema.keys():
                return kind
        return None

    def _typed(self, schema: dict, kind: Any, name: str, where: str) -> str:
        if kind is None:
            return self.primitive("value")
        if kind in ("number", "integer") and (kind == "integer" or set(BOUNDS) & schema.keys()):
            return self._integer(schema, where) if kind == "integer" else self._number(schema, where)
        if kind in ("number", "boolean", "null"):
            return self.primitive(kind)
        if kind == "string":
            return self._string(schema, where)
        if kind == "array":
            return self._array(schema, name, where)
        if kind == "object":
            return object_rule(self, schema, name, where)
        raise self.error(where, f"unknown type {kind!r}")

    # -- references and combinations

    def _ref(self, ref: Any, where: str) -> str:
        target = self._resolve(ref, where)
        key = (id(self.document), ref)
        if key not in self._refs:
            last = ref.rsplit("/", 1)[-1] if ref != "#" else "root-ref"
            name = self._refs[key] = self.add_rule(last, f"<{ref}>")  # reserved first: refs may recurse
            self.rules[name] = self.body(target, name, ref)
        return self._refs[key]

    def _union(self, options: Any, key: str, name: str, where: str) -> str:
        if not isinstance(options, list) or not options:
            raise self.error(where, f"'{key}' must be a non-empty list")
        return " | ".join(self.visit(opt, f"{name}-{i}", f"{where}/{key}/{i}") for i, opt in enumerate(options))

    def _all_of(self, parts: Any, name: str, where: str) -> str:
        if not isinstance(parts, list) or not parts:
            raise self.error(where, "'allOf' must be a non-empty list")
        if len(parts) == 1:
            return self.body(parts[0], name, f"{where}/allOf/0")
        merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
        for i, part in enumerate(parts):
            while isinstance(part, dict) and "$ref" in part and len(part) == 1:
                part = self._resolve(part["$ref"], f"{where}/allOf/{i}")
            if not isinstance(part, dict) or self._implied_type(part) != "object" and part.get("type") != "object":
                raise self.error(f"{where}/allOf/{i}", "'allOf' is supported only for object schemas")
            merged["properties"].update(part.get("properties", {}))
            merged["required"] += [r for r in part.get("required", []) if r not in merged["required"]]
            if "additionalProperties" in part:
                merged["additionalProperties"] = part["additionalProperties"]
        return object_rule(self, merged, name, where)

    def _resolve(self, ref: Any, where: str) -> Any:
        """The schema a local reference ('#', '#/$defs/x', any JSON pointer) points to."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise self.error(where, f"only references into the same schema ('#/...') are supported, not {ref!r}")
        target = self.document
        for part in (ref[1:].split("/")[1:] if ref != "#" else []):
            key = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and key in target:
                target = target[key]
            elif isinstance(target, list) and key.isdigit() and int(key) < len(target):
                target = target[int(key)]
            else:
                raise self.error(where, f"the reference {ref!r} points to nothing")
        return target

    # -- types

    def _count(self, schema: dict, key: str, where: str, default: int | None) -> int | None:
        value = schema.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.error(where, f"'{key}' must be a non-negative integer")
        if value > MAX_REPETITION:
            if key.startswith("min"):
                raise self.error(where, f"'{key}' above {MAX_REPETITION} is not supported")
            return None  # a maximum that large is no limit in practice (llama.cpp does the same)
        return value

    def _string(self, schema: dict, where: str) -> str:
        low = self._count(schema, "minLength", where, 0) or 0
        high = self._count(schema, "maxLength", where, None)
        if high is not None and high < low:
            raise self.error(where, "'maxLength' is below 'minLength'")
        if "pattern" in schema:
            if "minLength" in schema or "maxLength" in schema:
                raise self.error(where, "'pattern' together with 'minLength' or 'maxLength' is not supported")
            self.primitive("char")
            return f'"\\"" ({pattern_to_gbnf(schema["pattern"], where)}) "\\""'
        fmt = schema.get("format")
        if fmt in _FORMATS:
            return self.primitive(_FORMATS[fmt])
        if low == 0 and high is None:
            return self.primitive("string")
        char = self.primitive("char")
        counts = f"{{{low}}}" if high == low else f"{{{low},{'' if high is None else high}}}"
        return f'"\\"" {char}{counts} "\\""'

    def _number(self, schema: dict, where: str) -> str:
        bounds = ", ".join(repr(k) for k in BOUNDS if k in schema)
        raise self.error(where, f"{bounds} on a number are not supported (only on integers)")

    def _integer(self, schema: dict, where: str) -> str:
        low, high = integer_bounds(schema, lambda problem: self.error(where, problem))
        if low is None and high is None:
            return self.primitive("integer")
        if low is not None and high is not None and low > high:
            raise self.error(where, f"no integer lies between {low} and {high}")
        return integer_range(low, high)

    def _array(self, schema: dict, name: str, where: str) -> str:
        items = schema.get("items")
        prefix = schema.get("prefixItems")
        if isinstance(items, list):  # draft 4-2019 tuple form
            prefix, items = items, schema.get("additionalItems", False)
        low = self._count(schema, "minItems", where, 0) or 0
        high = self._count(schema, "maxItems", where, None)
        if high is not None and high < low:
            raise self.error(where, "'maxItems' is below 'minItems'")
        space = self.primitive("space")
        if prefix is not None:
            if not isinstance(prefix, list) or "minItems" in schema or "maxItems" in schema:
                raise self.error(where, "'prefixItems' must be a list, and cannot be combined with minItems/maxItems")
            parts = [self.visit(s, f"{name}-{i}", f"{where}/prefixItems/{i}") for i, s in enumerate(prefix)]
            seq = f' "," {space} '.join(parts)
            if items not in (None, False):
                extra = self.visit(items, f"{name}-item", f"{where}/items")
                seq += f' ("," {space} {extra})*'
            return f'"[" {space} {seq} {space} "]"'
        if items in (None, True, {}) and low == 0 and high is None:
            return self.primitive("array")
        item = self.visit(items if items is not None else True, f"{name}-item", f"{where}/items")
        return f'"[" {space} {repetition(item, low, high, f"{chr(34)},{chr(34)} {space}")} {space} "]"'


def json_schema_to_gbnf(schema: Any) -> str:
    """GBNF text for JSON documents valid against `schema` (a dict, or True/False)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise GrammarError(f"the schema is not valid JSON: {exc}", _HINT) from None
    rules = SchemaRules(schema)
    root = rules.visit(schema, "root")
    if root != "root":
        return rules.text(root)
    return rules.text()


def json_schema_grammar(schema: Any) -> Grammar:
    """The Grammar for `schema` (GrammarError for unsupported or invalid schemas)."""
    return parse_gbnf(json_schema_to_gbnf(schema))


def json_object_grammar(object_only: bool = False) -> Grammar:
    """Any JSON value, as llama.cpp's response_format json_object allows; `object_only` holds it
    to a JSON object."""
    return json_schema_grammar({"type": "object"} if object_only else {})
