"""/v1/messages, Anthropic's Messages API (kinetic/server/anthropic_api.py): the translation into the
chat route's request on its own, then the real `anthropic` package against a server on SmolLM2:
text (the chat route's own answer), streaming events, stop sequences, a tool round trip, token
counting and errors in Anthropic's shape."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from kinetic.runtime.generation import Finished
from kinetic.server.anthropic_api import openai_body, stop_reason
from kinetic.server.body import Fields
from kinetic.server.errors import ApiError, ContextExceeded, error_body
from tests.server.live import url_fixture

GREEDY = {"temperature": 0}  # sent as extra_body: anthropic 2.x dropped the sampler arguments
HELLO = [{"role": "user", "content": "Say hello."}]
TOOLS = [{"name": "get_weather", "description": "Get the current weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


# -- the translation -------------------------------------------------------------------------------------


def test_blocks_become_the_chat_request_they_mean():
    """System blocks join into one system message; tool_use blocks become the assistant's
    tool_calls, tool_result blocks tool messages named after their call (before the user's text);
    tools, tool_choice any, stop_sequences and max_tokens map to OpenAI's fields; metadata is dropped."""
    body = openai_body(Fields({
        "system": [{"type": "text", "text": "Be brief. "}, {"type": "text", "text": "Use tools."}],
        "messages": [*WEATHER,
                     {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                                       {"type": "tool_use", "id": "t1", "name": "get_weather",
                                                        "input": {"city": "Paris"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                   "content": [{"type": "text", "text": "18 C"}]},
                                                  {"type": "text", "text": "And tomorrow?"}]}],
        "tools": TOOLS, "tool_choice": {"type": "any"}, "stop_sequences": ["\n\n"], "max_tokens": 64,
        "metadata": {"user_id": "u"}, "temperature": 0.5}))
    assert body["messages"] == [
        {"role": "system", "content": "Be brief. Use tools."}, *WEATHER,
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "18 C", "name": "get_weather"},
        {"role": "user", "content": "And tomorrow?"}]
    assert body["tools"] == [{"type": "function", "function": {"name": "get_weather", "description":
                                                               TOOLS[0]["description"],
                                                               "parameters": TOOLS[0]["input_schema"]}}]
    assert body["tool_choice"] == "required" and body["stop"] == ["\n\n"] and body["max_tokens"] == 64
    assert body["temperature"] == 0.5 and "metadata" not in body


@pytest.mark.parametrize("choice,expected", [
    ({"type": "auto"}, "auto"), ({"type": "none"}, "none"), ({"type": "any"}, "required"),
    ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}})])
def test_tool_choice_maps_to_openai(choice, expected):
    """Each Anthropic tool_choice is the OpenAI tool_choice of the same meaning."""
    assert openai_body(Fields({"messages": WEATHER, "tools": TOOLS, "tool_choice": choice}))["tool_choice"] == expected


@pytest.mark.parametrize("message,param", [
    ({"role": "user", "content": [{"type": "image", "source": {}}]}, "messages[0].content[0]"),
    ({"role": "system", "content": "hi"}, "messages[0].role"),
    ({"role": "user", "content": 3}, "messages[0].content"),
])
def test_what_cannot_be_served_is_a_400_naming_the_field(message, param):
    """An image block, a role Anthropic does not have and content of the wrong type are refused
    with a 400 whose param names the field."""
    with pytest.raises(ApiError) as refused:
        openai_body(Fields({"messages": [message]}))
    assert refused.value.status == 400 and refused.value.param == param


def test_errors_are_in_anthropics_shape():
    """/v1/messages errors read {"type": "error", "error": {"type", "message"}}, a context overflow
    in Anthropic's words."""
    assert error_body("/v1/messages", 401, "no key") == \
        {"type": "error", "error": {"type": "authentication_error", "message": "no key"}}
    body = ContextExceeded(600, 512).body("/v1/messages")
    assert body["type"] == "error" and body["error"]["message"].startswith("prompt is too long: 600 tokens > 512")


def _finished(reason: str, stop_type: str, word: str = "") -> Finished:
    return Finished(reason, stop_type, word, 5, 3, [], 0.0, 0.0, None)


def test_stop_reasons():
    """end_turn, max_tokens, stop_sequence (with the sequence) and tool_use, from how the answer ended."""
    assert stop_reason(_finished("stop", "eos"), calls=False) == ("end_turn", None)
    assert stop_reason(_finished("length", "limit"), calls=False) == ("max_tokens", None)
    assert stop_reason(_finished("stop", "word", "Paris"), calls=False) == ("stop_sequence", "Paris")
    assert stop_reason(_finished("stop", "eos"), calls=True) == ("tool_use", None)


# -- the anthropic package against a server ----------------------------------------------------------------


url = url_fixture()


@pytest.fixture(scope="module")
def client(url):
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)


def test_text_is_the_chat_routes_answer(client, url):
    """A greedy message is the text /v1/chat/completions answers to the same messages, with
    Anthropic's id, stop_reason and usage."""
    reply = client.messages.create(model="any", max_tokens=24, messages=HELLO, extra_body=GREEDY)
    chat = httpx.post(url + "/v1/chat/completions", json={"messages": HELLO, "max_tokens": 24, **GREEDY},
                      timeout=120).json()
    assert reply.id.startswith("msg_") and reply.role == "assistant" and reply.type == "message"
    assert [b.type for b in reply.content] == ["text"]
    assert reply.content[0].text == chat["choices"][0]["message"]["content"]
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 24
    assert reply.usage.input_tokens == chat["usage"]["prompt_tokens"]


def test_stream_events_build_the_same_message(client):
    """Streamed, the events come in Anthropic's order (message_start, one text block's start,
    deltas and stop, message_delta, message_stop) and add up to the whole answer."""
    whole = client.messages.create(model="any", max_tokens=24, messages=HELLO, extra_body=GREEDY)
    with client.messages.stream(model="any", max_tokens=24, messages=HELLO, extra_body=GREEDY) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start" and kinds[-1] == "message_stop"
    assert kinds[-2] == "message_delta" and kinds[-3] == "content_block_stop"
    assert set(kinds[2:-3]) <= {"content_block_delta", "text"} and "content_block_delta" in kinds
    assert final.content[0].text == whole.content[0].text and final.stop_reason == "max_tokens"


def test_stop_sequence_cuts_the_answer_and_is_named(client):
    """A stop sequence taken from the middle of the greedy answer ends it there: stop_reason
    stop_sequence, the sequence named, the text before it returned."""
    text = client.messages.create(model="any", max_tokens=24, messages=HELLO, extra_body=GREEDY).content[0].text
    word = text.split()[3]
    reply = client.messages.create(model="any", max_tokens=24, messages=HELLO, stop_sequences=[word],
                                   extra_body=GREEDY)
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == word
    assert reply.content[0].text == text[:text.index(word)]


def test_tool_round_trip(client):
    """tool_choice any gives a tool_use block (stop_reason tool_use, input following the schema);
    sent back with a tool_result, the next answer is a well-formed message; streamed, the call
    arrives as a tool_use block built from input_json_delta."""
    call = client.messages.create(model="any", max_tokens=100, messages=WEATHER, tools=TOOLS,
                                  tool_choice={"type": "any"}, extra_body=GREEDY)
    use = call.content[-1]
    assert call.stop_reason == "tool_use" and use.type == "tool_use" and use.name == "get_weather"
    assert use.id.startswith("toolu_") and isinstance(use.input["city"], str)
    answer = client.messages.create(model="any", max_tokens=60, tools=TOOLS, extra_body=GREEDY, messages=[
        *WEATHER, {"role": "assistant", "content": call.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C, sunny"}]}])
    assert answer.stop_reason in ("end_turn", "tool_use", "max_tokens") and answer.content
    assert all(b.type in ("text", "tool_use") for b in answer.content)
    with client.messages.stream(model="any", max_tokens=100, messages=WEATHER, tools=TOOLS,
                                tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert "input_json" in kinds and streamed.stop_reason == "tool_use"
    assert streamed.content[-1].type == "tool_use" and streamed.content[-1].input == use.input


def test_count_tokens_is_the_prompt_the_message_runs(client):
    """count_tokens answers the input tokens a message with the same body reports: those that ran
    plus those read from the cache (Warm Start), as Anthropic's usage splits them."""
    counted = client.messages.count_tokens(model="any", messages=WEATHER, tools=TOOLS)
    reply = client.messages.create(model="any", max_tokens=1, messages=WEATHER, tools=TOOLS, extra_body=GREEDY)
    assert counted.input_tokens == reply.usage.input_tokens + reply.usage.cache_read_input_tokens


def test_errors_reach_the_client_as_anthropic_errors(client):
    """A bad request and a prompt longer than the context raise the package's BadRequestError with
    Anthropic's error body (a context overflow says "prompt is too long")."""
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="any", max_tokens=10, messages=[{"role": "system", "content": "x"}])
    assert bad.value.body["type"] == "error" and bad.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError) as long:
        client.messages.create(model="any", max_tokens=10, messages=[{"role": "user", "content": "word " * 2000}])
    assert "prompt is too long" in long.value.body["error"]["message"]
