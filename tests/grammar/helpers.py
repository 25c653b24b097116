"""Helpers for the grammar tests: whole-text matching, decoding driven by the mask alone, and a
small JSON Schema validator for the subset the tests use (the jsonschema package is not installed)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from kinetic.grammar import GrammarError, GrammarMatcher, TokenVocab, apply_mask

CLOSERS = b'"}]<>/)\n'
_DATE = re.compile(r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])")


def full_match(matcher: GrammarMatcher, text: str | bytes) -> bool:
    """True when the whole text is a complete match of the matcher's grammar."""
    state = matcher.start()
    try:
        state.accept_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    except GrammarError:
        return False
    return state.is_complete


def prefix_ok(matcher: GrammarMatcher, text: str | bytes) -> bool:
    """True when the text can still be continued to a match."""
    state = matcher.start()
    try:
        state.accept_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    except GrammarError:
        return False
    return True


def closing_bias(vocab: TokenVocab) -> np.ndarray:
    """A logit bonus for tokens holding closing punctuation and for end of generation, so random
    decoding finishes its strings and containers in a few hundred tokens."""
    bias = np.array([3.0 if any(c in p for c in CLOSERS) else 0.0 for p in vocab.pieces], dtype=np.float32)
    bias[vocab.eog_ids] = 6.0
    return bias


def closing_steer(vocab: TokenVocab, closing: bytes):
    """A per-step bonus for the tokens that continue writing `closing` from the end of the text so
    far (as a model that wants to close a free-text field would)."""
    pieces = vocab.pieces

    def steer(text: bytes) -> np.ndarray:
        bonus = np.zeros(vocab.n_vocab, dtype=np.float32)
        if text.endswith(closing):
            return bonus
        done = max(k for k in range(len(closing)) if text.endswith(closing[:k]))
        rest = closing[done:]
        for i, piece in enumerate(pieces):
            if piece and rest.startswith(piece):
                bonus[i] = 10.0
        return bonus

    return steer


def random_decode(matcher: GrammarMatcher, seed: int, bias: np.ndarray, max_tokens: int = 400, steer=None):
    """Greedy decoding of random logits under the mask: (token ids, ended with end of generation).
    Checks on the way that the chosen token was allowed and end of generation only when complete.
    `steer(text so far) -> bonus` adds a per-step bonus."""
    vocab = matcher.vocab
    rng = np.random.default_rng(seed)
    state = matcher.start()
    out: list[int] = []
    text = b""
    for _ in range(max_tokens):
        logits = rng.standard_normal(vocab.n_vocab).astype(np.float32) * 2 + bias
        if steer is not None:
            logits += steer(text)
        apply_mask(logits, state)
        token = int(np.argmax(logits))
        assert np.isfinite(logits[token]), "the mask allowed nothing"
        if vocab.is_eog(token):
            assert state.is_complete
            return out, True
        state.accept(token)
        out.append(token)
        text += vocab.pieces[token]
    return out, False


def validate(value: Any, schema: Any, root: Any = None) -> list[str]:
    """Problems with `value` against `schema` (empty: valid), for the keywords the tests use."""
    root = schema if root is None else root
    if schema is True or schema == {}:
        return []
    if "$ref" in schema:
        target = root
        for part in schema["$ref"][2:].split("/"):
            target = target[part]
        return validate(value, target, root)
    if "anyOf" in schema or "oneOf" in schema:
        options = schema.get("anyOf") or schema.get("oneOf")
        return [] if any(not validate(value, s, root) for s in options) else [f"{value!r} matches no option"]
    if "const" in schema:
        return [] if value == schema["const"] and type(value) is type(schema["const"]) else [f"{value!r} != const"]
    if "enum" in schema:
        return [] if any(value == e and type(value) is type(e) for e in schema["enum"]) else [f"{value!r} not in enum"]
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if kind is not None and not any(_is_type(value, k) for k in kinds):
        return [f"{value!r} is not of type {kind}"]
    problems: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties", {})
        problems += [f"missing {r}" for r in schema.get("required", []) if r not in value]
        extra = schema.get("additionalProperties", "properties" not in schema)
        for key, item in value.items():
            if key in props:
                problems += validate(item, props[key], root)
            elif extra is False:
                problems.append(f"unexpected key {key!r}")
            elif isinstance(extra, dict):
                problems += validate(item, extra, root)
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
            problems.append(f"{len(value)} items")
        for item in value:
            problems += validate(item, schema.get("items", {}), root)
    if isinstance(value, str):
        if not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value)):
            problems.append(f"length {len(value)}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            problems.append(f"{value!r} does not match {schema['pattern']}")
        if schema.get("format") == "date" and not _DATE.fullmatch(value):  # syntax, as the grammar holds it
            problems.append(f"{value!r} is not a date")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            problems.append(f"{value} < minimum")
        if "maximum" in schema and value > schema["maximum"]:
            problems.append(f"{value} > maximum")
    return problems


def _is_type(value: Any, kind: str) -> bool:
    return {
        "object": isinstance(value, dict), "array": isinstance(value, list), "string": isinstance(value, str),
        "boolean": isinstance(value, bool), "null": value is None,
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
    }[kind]
