"""JSON mode answers an object (an empty or missing schema means any object, as llama.cpp reads it),
on every route that has it, and structured output is compact: no newline padding."""

from __future__ import annotations

import json

import httpx
import pytest

from kinetic.grammar import GrammarMatcher, TokenVocab, json_schema_grammar
from kinetic.server.body import Fields
from kinetic.server.constraints import llama_grammar, ollama_grammar, openai_grammar
from tests.grammar.helpers import full_match
from tests.server.live import openai_client_fixture, url_fixture

# SmolLM2 answers this with a bare number when JSON mode allows any value.
NUMBER = [{"role": "user", "content": "What is 2+2? Reply with the number only."}]
OBJECT_REQUESTS = [
    (openai_grammar, {"response_format": {"type": "json_object"}}),
    (openai_grammar, {"response_format": {"type": "json_object", "schema": {}}}),
    (openai_grammar, {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
    (openai_grammar, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}),
    (openai_grammar, {"json_schema": {}}),
    (llama_grammar, {"json_schema": {}}),
    (ollama_grammar, {"format": "json"}),
    (ollama_grammar, {"format": {}}),
]


@pytest.mark.parametrize("reader,body", OBJECT_REQUESTS, ids=[json.dumps(b) for _, b in OBJECT_REQUESTS])
def test_json_mode_and_empty_schemas_hold_the_answer_to_an_object(reader, body):
    """Each way of asking for JSON without a schema compiles to a grammar that takes an object and
    refuses a bare string, number, list or null."""
    spec = reader(Fields(body))
    vocab = TokenVocab([bytes([b]) for b in range(256)] + [b""], eog_ids=[256])
    matcher = GrammarMatcher(json_schema_grammar(spec.schema), vocab)
    assert full_match(matcher, '{"answer": 4}') and full_match(matcher, "{}")
    for text in ["4", '"four"', "[4]", "null", "true"]:
        assert not full_match(matcher, text), text


url = url_fixture()
client = openai_client_fixture()


def test_json_object_answers_an_object_where_any_value_gave_a_number(client):
    """response_format json_object, greedy, on a question SmolLM2 answers with a bare number: the
    content parses to an object (OpenAI package), with no newline inside."""
    reply = client.chat.completions.create(model="any", messages=NUMBER, temperature=0, max_tokens=40,
                                           response_format={"type": "json_object"})
    content = reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop" and isinstance(json.loads(content), dict)
    assert "\n" not in content


def test_completion_with_an_empty_json_schema_answers_an_object(url):
    """llama-server's /completion with json_schema {} holds the answer to an object, as llama.cpp does."""
    body = {"prompt": "2+2=", "json_schema": {}, "n_predict": 40, "temperature": 0}
    answer = httpx.post(url + "/completion", json=body, timeout=120).json()
    assert answer["stop_type"] == "eos" and isinstance(json.loads(answer["content"]), dict)


def test_forced_tool_call_is_compact(url):
    """A forced tool call on SmolLM2 (Llama 3's bare JSON) is not padded: this question took 76 tokens
    when newlines were allowed (`{\n    "name"\n\n:\n\n...`), 36 compact."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city"]}}}]
    body = {"messages": [{"role": "user", "content": "What's the weather in Paris?"}], "tools": tools,
            "tool_choice": "required", "temperature": 0, "max_tokens": 100}
    answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()
    call = answer["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and isinstance(json.loads(call["arguments"])["city"], str)
    assert answer["usage"]["completion_tokens"] < 50
