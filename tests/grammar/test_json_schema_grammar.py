"""JSON Schema to grammar: valid documents are accepted byte by byte, invalid ones rejected, and
schemas outside the subset fail with an error naming the keyword and where it is."""

from __future__ import annotations

import json
import re

import pytest

from kinetic.grammar import GrammarError, json_object_grammar, json_schema_grammar, json_schema_to_gbnf
from kinetic.grammar.json_text import integer_range
from tests.grammar.helpers import full_match, prefix_ok

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "minLength": 1}, "age": {"type": "integer"},
                   "email": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2}},
    "required": ["name", "age"],
}

CASES = [
    (PERSON,
     ['{"name":"Ann","age":3}', '{ "name" : "A\\"b\\u00e9", "age": -12, "tags": ["x"] }',
      '{"name":"é","age":0,"email":"a@b","tags":[]}'],
     ['{\n  "name": "Ethan",\n  "age": 25\n}', '{"name":"Ann" ,"age":3}', '{"name":  "Ann","age":3}',
      '{"age":3,"name":"Ann"}', '{"name":"","age":3}', '{"name":"Ann"}', '{"name":"Ann","age":3.5}',
      '{"name":"Ann","age":3,"x":1}', '{"name":"Ann","age":3,"tags":["a","b","c"]}', '{"name":"Ann","age":03}',
      '{"name":"A\nB","age":3}', ' {"name":"Ann","age":3}']),
    ({"type": "array", "items": {"type": "number"}, "minItems": 1},
     ["[1]", "[ -0.5, 1e10, 2E-3 ]", "[0,0.25]"], ["[]", "[1,]", "[01]", "[.5]", "[1.]", "[NaN]", "[1 ,2]", "[\n1]"]),
    ({"enum": ["red", 2, None, True, {"a": [1]}]},
     ['"red"', "2", "null", "true", '{"a":[1]}'], ['"blue"', "3", "false", '{"a": [1]}']),
    ({"const": "x"}, ['"x"'], ['"y"', "x"]),
    ({"anyOf": [{"type": "boolean"}, {"type": "string", "maxLength": 2}]},
     ["true", '"ab"', '""'], ['"abc"', "1"]),
    ({"type": ["integer", "null"]}, ["5", "null"], ['"5"', "5.0"]),
    ({"type": "string", "format": "date"}, ['"2024-02-29"'], ['"2024-13-01"', '"24-01-01"']),
    ({"type": "string", "format": "uuid"}, ['"123e4567-e89b-12d3-a456-426614174000"'], ['"123e4567"']),
    ({"type": "string", "format": "date-time"}, ['"2024-01-02T03:04:05Z"', '"2024-01-02T03:04:05.123+01:00"'],
     ['"2024-01-02 03:04:05"']),
    ({"type": "string", "format": "email"}, ['"anything"'], []),  # unknown formats are annotations
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True},
     ['{"a":1,"b":[true]}', '{"zz":null}', "{}", '{"ab":1}'], ['{"b":1,"a":1}', '{"a":1,"a":2}']),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
     ['{"a":1,"b":"x"}'], ['{"a":1,"b":2}']),
    ({"type": "object"}, ['{"any":{"thing":[1,"2",null]}}', "{}"], ["[]"]),
    ({"type": "object", "properties": {}}, ["{}"], ['{"a":1}']),
    ({"$defs": {"node": {"type": "object", "properties": {
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}, "$ref": "#/$defs/node"},
     ['{"kids":[{"kids":[]},{}]}', "{}"], ['{"kids":[1]}']),
    ({"definitions": {"n": {"type": "integer", "minimum": 1}}, "type": "array", "items": {"$ref": "#/definitions/n"}},
     ["[1,2]"], ["[0]"]),
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"type": "object", "properties": {"b": {"type": "boolean"}}}]},
     ['{"a":1,"b":true}', '{"a":1}'], ['{"b":true}']),
    ({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]}, ['[1,"a"]'], ["[1]", '[1,"a",2]']),
    ({"type": "string", "pattern": "^[A-Z][a-z]+(-[A-Z][a-z]+)?$"}, ['"Anne"', '"Anne-Marie"'], ['"anne"', '"Anne-"']),
    ({"type": "string", "pattern": "\\d{3}"}, ['"abc123def"', '"123"'], ['"12"']),
    ({"type": "string", "pattern": '^a"b\\\\c$'}, ['"a\\"b\\\\c"'], ['"a"b\\c"']),
    ({"type": "object", "properties": {"p": {"type": "integer"}, "q": {"type": "integer"}}},
     ['{"p":1,"q":2}', '{"q":2}', '{"p":1}', "{}"], ['{"q":2,"p":1}', '{"p":1,}', '{,"q":2}']),
    ({"type": "integer", "nullable": True}, ["1", "null"], ['"1"']),
    (True, ["1", '"x"', "[]"], ["x"]),
]


@pytest.mark.parametrize("schema, valid, invalid", CASES, ids=[json.dumps(c[0])[:40] for c in CASES])
def test_schema_accepts_valid_and_rejects_invalid(byte_matcher, schema, valid, invalid):
    """Every valid document is a complete match, byte by byte; every invalid one is not."""
    matcher = byte_matcher(json_schema_grammar(schema))
    for doc in valid:
        assert full_match(matcher, doc), doc
    for doc in invalid:
        assert not full_match(matcher, doc), doc


@pytest.mark.parametrize("low, high", [(0, 150), (-5, 7), (13, 13), (-120, -7), (7, 1000), (-1000, None),
                                       (None, -3), (10, None), (None, 99), (0, 0), (1, 9), (-9, -1), (99, 101)])
def test_integer_ranges_exact(byte_matcher, low, high):
    """An integer range grammar matches exactly the integers in the range (checked from -1200 to
    1200), written without leading zeros."""
    matcher = byte_matcher(f"root ::= {integer_range(low, high)}\n")
    for n in range(-1200, 1201):
        inside = (low is None or n >= low) and (high is None or n <= high)
        assert full_match(matcher, str(n)) == inside, n
    assert not full_match(matcher, "007")
    assert not full_match(matcher, "-0")


def test_integer_bounds_from_schema(byte_matcher):
    """minimum / maximum and their exclusive forms (draft 6+ numbers and draft 4 booleans) bound integers."""
    cases = [({"minimum": 2, "exclusiveMaximum": 5}, [2, 3, 4]), ({"exclusiveMinimum": 2, "maximum": 5}, [3, 4, 5]),
             ({"minimum": 2, "maximum": 5, "exclusiveMinimum": True}, [3, 4, 5]),
             ({"minimum": 1.5, "maximum": 3.5}, [2, 3])]
    for bounds, inside in cases:
        matcher = byte_matcher(json_schema_grammar({"type": "integer", **bounds}))
        assert [n for n in range(-3, 10) if full_match(matcher, str(n))] == inside, bounds


def test_any_json_value(byte_matcher):
    """json_object accepts any JSON value, compact or with single spaces after separators, and
    rejects what is not JSON and newline padding (the compact `space`)."""
    matcher = byte_matcher(json_object_grammar())
    values = [{"a": [1, 2.5, -3e-2, None, True, False, "x\ty"]}, [], {}, "é\u2028", 0, [[[]]], {"k": {"n": {}}}]
    for value in values:
        for separators in ((",", ":"), (", ", ": ")):
            assert full_match(matcher, json.dumps(value, separators=separators)), value
            assert full_match(matcher, json.dumps(value, separators=separators, ensure_ascii=False)), value
    assert not full_match(matcher, json.dumps({"a": [1]}, indent=2))
    for text in ['{"a" 1}', "[1 2]", "tru", "{'a': 1}", '"\\x"', "[1,]", "01", '{"a":1}x']:
        assert not full_match(matcher, text), text
    assert prefix_ok(matcher, '{"a": [1, {"b": "c')


def test_pattern_semantics_match_python_re(byte_matcher):
    """A supported pattern holds a JSON string's text exactly as re.search does (anchors included)."""
    patterns = ["^ab*c$", "ab|cd", "^(x|yz)+$", "^[^0-9]{2,3}$", "^a.c$", "^\\w+@\\w+\\.com$", "^\\s?[-+]?\\d+$"]
    texts = ["", "ac", "abbc", "xabcx", "cd", "ab", "xyzx", "yzyz", "ab", "abc", "a c", "a\nc", "x_y@ab.com",
             "x@y.org", "+12", " -3", "12a", "é!"]
    for pattern in patterns:
        matcher = byte_matcher(json_schema_grammar({"type": "string", "pattern": pattern}))
        for text in texts:
            expected = re.search(pattern, text) is not None
            assert full_match(matcher, json.dumps(text, ensure_ascii=False)) == expected, (pattern, text)


@pytest.mark.parametrize("schema, where, problem", [
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "#/properties/a", "'not' is not supported"),
    ({"type": "array", "uniqueItems": True}, "#", "'uniqueItems' is not supported"),
    ({"type": "number", "minimum": 0}, "#", "'minimum' on a number are not supported"),
    ({"type": "object", "patternProperties": {"^x": {}}, "minProperties": 1}, "#",
     "'patternProperties', 'minProperties' are not supported"),
    ({"$ref": "#/$defs/missing"}, "#", "points to nothing"),
    ({"$ref": "https://example.com/schema.json"}, "#", "only references into the same schema"),
    ({"type": "string", "pattern": "^(a)\\1$"}, "#", "backreferences"),
    ({"type": "string", "pattern": "^(?=a)a$"}, "#", "lookarounds"),
    ({"type": "array", "items": False}, "#/items", "the schema false matches nothing"),
    ({"type": "thing"}, "#", "unknown type 'thing'"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "anyOf": [{"required": ["a"]}]}, "#",
     "combining 'anyOf', 'properties' in one schema is not supported"),
    ({"type": "string", "minLength": 3, "maxLength": 2}, "#", "'maxLength' is below 'minLength'"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "#", "no integer lies between 5 and 4"),
])
def test_unsupported_schemas_name_the_problem(schema, where, problem):
    """A schema outside the subset raises GrammarError naming the keyword and the JSON pointer."""
    with pytest.raises(GrammarError) as info:
        json_schema_grammar(schema)
    assert f"schema error at {where}:" in str(info.value)
    assert problem in str(info.value)


def test_schema_text_is_accepted_as_json_string():
    """A schema given as JSON text converts like the parsed object; bad JSON text is a GrammarError."""
    assert json_schema_to_gbnf(json.dumps(PERSON)) == json_schema_to_gbnf(PERSON)
    with pytest.raises(GrammarError, match="not valid JSON"):
        json_schema_to_gbnf("{nope")


def test_annotations_are_ignored():
    """Titles, descriptions, defaults, examples and $schema change nothing."""
    annotated = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "P", "description": "d",
                 **PERSON, "examples": [{}], "default": {}}
    assert json_schema_to_gbnf(annotated) == json_schema_to_gbnf(PERSON)
