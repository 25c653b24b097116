"""/v1/responses, OpenAI's Responses API (kinetic/server/responses_api.py, responses_input.py): the
translation and the response store on their own, then the real `openai` package against a server
on SmolLM2: text (the chat route's own answer), the event stream, previous_response_id, function
calls and their outputs, retrieval and the errors of an unknown or unstored response."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from kinetic.server.body import Fields
from kinetic.server.errors import ApiError
from kinetic.server.responses_input import ResponseStore, Stored, read_request
from tests.server.live import openai_client_fixture, url_fixture

TOOL = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


# -- the translation and the store -------------------------------------------------------------------------


def test_items_become_the_chat_request_they_mean():
    """instructions is the system message; a function_call item joins the assistant message before
    it as a tool call, its output is a tool message named after it; flat function tools, a named
    tool_choice and text.format json_schema become OpenAI's nested fields."""
    asked = read_request(Fields({
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
                  {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
                  {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
                  {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
                  {"type": "reasoning", "summary": []}],
        "tools": [TOOL], "tool_choice": {"type": "function", "name": "get_weather"}, "max_output_tokens": 9,
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}}}), ResponseStore())
    body = asked.body
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18 C", "name": "get_weather"}]
    assert asked.history == body["messages"][1:]  # instructions are not carried to a later response
    assert body["tools"] == [{"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["max_tokens"] == 9
    schema = {"name": "w", "schema": {"type": "object"}}
    assert body["response_format"] == {"type": "json_schema", "json_schema": schema}


def test_previous_response_comes_before_the_new_input():
    """previous_response_id puts the stored conversation before the new input; an unknown id is a
    404 with OpenAI's code previous_response_not_found."""
    store = ResponseStore()
    earlier = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    store.put("resp_1", Stored(earlier, {}))
    asked = read_request(Fields({"input": "And you?", "previous_response_id": "resp_1"}), store)
    assert asked.body["messages"] == [*earlier, {"role": "user", "content": "And you?"}]
    with pytest.raises(ApiError) as missing:
        read_request(Fields({"input": "x", "previous_response_id": "resp_2"}), store)
    assert missing.value.status == 404 and missing.value.extra["code"] == "previous_response_not_found"


def test_store_keeps_the_most_recently_used():
    """Past its size the store drops the least recently used response, not the oldest read one."""
    store = ResponseStore(size=2)
    for key in ("a", "b"):
        store.put(key, Stored([], {"id": key}))
    store.get("a")
    store.put("c", Stored([], {"id": "c"}))
    assert store.get("b") is None and store.get("a") is not None and store.get("c") is not None


@pytest.mark.parametrize("body,param", [
    ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0]"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]"),
    ({"input": []}, "input"),
])
def test_what_cannot_be_served_is_a_400_naming_the_field(body, param):
    """Images, hosted tools, item references and an empty input are refused naming the field."""
    with pytest.raises(ApiError) as refused:
        read_request(Fields(body), ResponseStore())
    assert refused.value.status == 400 and refused.value.param == param


# -- the openai package against a server -------------------------------------------------------------------


url = url_fixture()
client = openai_client_fixture()


def chat_answer(url: str, messages: list[dict], max_tokens: int) -> str:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()["choices"][0]["message"]["content"]


def test_text_is_the_chat_routes_answer(client, url):
    """A greedy response's output_text is what /v1/chat/completions answers to the same messages;
    max_output_tokens cutting it makes it incomplete, with the reason."""
    response = client.responses.create(model="any", input="Say hello.", instructions="Be kind.",
                                       max_output_tokens=8, temperature=0)
    messages = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Say hello."}]
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.output_text == chat_answer(url, messages, 8)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 8 and response.output[0].type == "message"


def test_stream_events_build_the_same_response(client):
    """Streamed, the events come in the Responses order (created, in_progress, the message item and
    its text part added, text deltas, their done events, completed) and the package's stream helper
    builds the same text as the whole response."""
    ask = {"model": "any", "input": "Say hi in three words.", "max_output_tokens": 200, "temperature": 0}
    whole = client.responses.create(**ask)
    assert whole.status == "completed"
    with client.responses.stream(**ask) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert final.output_text == whole.output_text


def test_previous_response_id_continues_the_conversation(client, url):
    """A response made with previous_response_id answers as the chat route does to the whole
    conversation written out (the earlier input, its answer, the new input)."""
    first = client.responses.create(model="any", input="My name is Ada.", max_output_tokens=16, temperature=0)
    second = client.responses.create(model="any", input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=16, temperature=0)
    messages = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": first.output_text},
                {"role": "user", "content": "What is my name?"}]
    assert second.previous_response_id == first.id
    assert second.output_text == chat_answer(url, messages, 16)
    assert client.responses.retrieve(second.id).output_text == second.output_text


def test_function_call_round_trip(client):
    """tool_choice required gives a function_call item (call_id, name, JSON arguments following the
    schema); its function_call_output sent back with previous_response_id gives a new response."""
    call = client.responses.create(model="any", input="What is the weather in Paris?", tools=[TOOL],
                                   tool_choice="required", max_output_tokens=100, temperature=0)
    item = call.output[-1]
    assert call.status == "completed" and item.type == "function_call" and item.name == "get_weather"
    assert item.call_id.startswith("call_") and isinstance(json.loads(item.arguments)["city"], str)
    answer = client.responses.create(model="any", previous_response_id=call.id, tools=[TOOL],
                                     input=[{"type": "function_call_output", "call_id": item.call_id,
                                             "output": "18 C, sunny"}], max_output_tokens=60, temperature=0)
    assert answer.output and all(o.type in ("message", "function_call") for o in answer.output)


def test_unknown_and_unstored_responses_are_not_found(client):
    """A response made with store false cannot be continued (404, previous_response_not_found), and
    an unknown id cannot be retrieved."""
    unstored = client.responses.create(model="any", input="Hi", store=False, max_output_tokens=2, temperature=0)
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="any", input="Again", previous_response_id=unstored.id, max_output_tokens=2)
    assert missing.value.code == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_unknown")
