"""JSON objects in GBNF: the properties in the schema's order, optional ones skippable, and other keys.

Owns: `object_rule` (the rule body for an object schema: properties, required, additionalProperties),
`members` (a chain of members with separators, linear in their number; tool_calls.py reuses it for
call arguments) and `key_not_in` (a JSON string that is none of the listed property names, so an
additional property cannot repeat a listed one).
Does not own: the schema walk, references and the other types (json_schema.py: SchemaRules, whose
`visit`, `add_rule` and `primitive` these functions call), JSON text primitives (json_text.py).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from kinetic.grammar.json_text import literal

if TYPE_CHECKING:
    from kinetic.grammar.json_schema import SchemaRules


def object_rule(rules: SchemaRules, schema: dict, name: str, where: str) -> str:
    """The body of a rule matching exactly the objects `schema` (of type object) accepts."""
    props = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties")
    if not isinstance(props, dict):
        raise rules.error(where, "'properties' must be an object")
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise rules.error(where, "'required' must be a list of strings")
    if "properties" not in schema and extra in (None, True, {}) and not required:
        return rules.primitive("object")
    props = {**props, **{r: True for r in required if r not in props}}
    if extra is None:
        extra = "properties" not in schema  # llama.cpp: listed properties are all there may be
    space = rules.primitive("space")
    entries: list[tuple[str, bool]] = []
    for key, sub in props.items():
        value = rules.visit(sub, f"{name}-{key}", f"{where}/properties/{key}")
        kv = rules.add_rule(f"{name}-{key}-kv", f'{rules.literal_value(str(key))} {space} ":" {space} {value}')
        entries.append((kv, key in required))
    extra_kv = None
    if extra is not False:
        value = rules.visit(extra, f"{name}-additional-value", f"{where}/additionalProperties")
        key_rule = key_not_in(rules, list(props), name)
        extra_kv = rules.add_rule(f"{name}-additional-kv", f'{key_rule} {space} ":" {space} {value}')
    return f'"{{" {space} {members(rules, entries, extra_kv, name)} {space} "}}"'


def members(rules: SchemaRules, entries: list[tuple[str, bool]], extra_kv: str | None, name: str,
            separator: str | None = None) -> str:
    """Members in order, each (rule, required), `separator` (a comma and space) between them:
    `first` (nothing written yet) and `after` (each member preceded by the separator) chains,
    one rule per member so the grammar stays linear in their number."""
    space = rules.primitive("space")
    sep = separator if separator is not None else f'"," {space}'
    after, first = "", ""
    if extra_kv is not None:
        after = rules.add_rule(f"{name}-more", f"({sep} {extra_kv})*")
        first = f"({extra_kv} {after})?"
    for i in range(len(entries) - 1, -1, -1):
        kv, is_required = entries[i]
        if is_required:
            new_after = f"{sep} {kv} {after}".strip()
            new_first = f"{kv} {after}".strip()
        else:
            new_after = f"({sep} {kv})? {after}".strip()
            new_first = f"{kv} {after}".strip() + f" | {first or chr(34) * 2}"
        after = rules.add_rule(f"{name}-after-{i}", new_after)
        first = rules.add_rule(f"{name}-from-{i}", new_first)
    return first


def key_not_in(rules: SchemaRules, names: list[str], name: str) -> str:
    """A key (a JSON string) that is none of `names`: a trie of the names, each node allowing any
    character but its children's, and the end of the string only where no name ends."""
    string = rules.primitive("string")
    escaped = [json.dumps(n, ensure_ascii=False)[1:-1] for n in names]
    if not names or any(e != n for e, n in zip(escaped, names, strict=True)):
        return string  # names that need escapes: any key (duplicates are then possible)
    char = rules.primitive("char")
    trie: dict = {}
    for n in names:
        node = trie
        for c in n:
            node = node.setdefault(c, {})
        node[""] = {}
    by_body: dict[str, str] = {}

    def node_rule(node: dict) -> str:
        alts = []
        children = sorted(c for c in node if c)
        for c in children:
            alts.append(f"{literal(c)} {node_rule(node[c])}")
        excluded = "".join(_class_literal(c) for c in children)
        alts.append(f'([^"\\\\\\x7F\\x00-\\x1F{excluded}] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{{4}})) '
                    f'{char}* "\\""')
        if "" not in node:
            alts.append('"\\""')
        body = " | ".join(alts)
        if body not in by_body:
            by_body[body] = rules.add_rule(f"{name}-key-{len(by_body) + 1}", body)
        return by_body[body]

    return rules.add_rule(f"{name}-other-key", f'"\\"" {node_rule(trie)}')


def _class_literal(c: str) -> str:
    """`c` written inside a GBNF character class."""
    return "\\" + c if c in "]-\\^[" else c
