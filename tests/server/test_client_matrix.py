"""The client packages people use, unchanged, against one live `kinetic serve smollm2-135m` (-c 512):
openai, anthropic, ollama, langchain-openai and litellm (the dev extra installs them; instructor runs
when it is installed). Each checks what its users do: chat, streaming, JSON mode (an object), JSON
Schema, tools with auto (the generic fallback), required and a named tool, a context overflow the
client recognises, Anthropic's tool round trip, the Responses API's text and stream. Shapes are
asserted, not the quality of a 135M model's answers. docs/server.md's client table lists the runs.
"""

from __future__ import annotations

import json
import os

import openai
import pytest

from tests.server.conftest import ServeProcess

GREEDY = {"temperature": 0}
HELLO = [{"role": "user", "content": "Say hello."}]
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
                                         "parameters": CITY}}
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
TOO_LONG = [{"role": "user", "content": "hello world " * 300}]  # about 600 tokens, over the 512 of the server


@pytest.fixture(scope="module")
def url():
    serve = ServeProcess()
    yield serve.url
    alive = serve.proc.poll() is None
    serve.stop()
    assert alive and "Traceback" not in "".join(serve.stderr), "".join(serve.stderr)


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


# -- openai ------------------------------------------------------------------------------------------------


def test_openai_chat_stream_and_structured_output(client):
    """Chat, a stream adding up to the same text, JSON mode answering an object, and a JSON Schema
    answer that parses to the schema's fields."""
    whole = client.chat.completions.create(model="any", messages=HELLO, max_tokens=16, **GREEDY)
    chunks = client.chat.completions.create(model="any", messages=HELLO, max_tokens=16, stream=True, **GREEDY)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.choices[0].message.content and streamed == whole.choices[0].message.content
    mode = client.chat.completions.create(model="any", messages=WEATHER, max_tokens=120,
                                          response_format={"type": "json_object"}, **GREEDY)
    assert isinstance(json.loads(mode.choices[0].message.content), dict)
    person = client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "Describe Ada Lovelace."}], max_tokens=60, **GREEDY,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    parsed = json.loads(person.choices[0].message.content)
    assert isinstance(parsed["name"], str) and isinstance(parsed["age"], int)


@pytest.mark.parametrize("choice", ["auto", "required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["auto", "required", "named"])
def test_openai_tools(client, choice):
    """auto (SmolLM2's template has no tool format: the generic fallback) answers a call or text;
    required and a named tool answer a get_weather call whose arguments follow the schema."""
    reply = client.chat.completions.create(model="any", messages=WEATHER, tools=[TOOL], tool_choice=choice,
                                           max_tokens=100, **GREEDY)
    message = reply.choices[0].message
    if choice == "auto" and not message.tool_calls:
        assert message.content and reply.choices[0].finish_reason in ("stop", "length")
        return
    call = message.tool_calls[0].function
    assert reply.choices[0].finish_reason == "tool_calls" and call.name == "get_weather"
    assert isinstance(json.loads(call.arguments)["city"], str)


def test_openai_context_overflow(client):
    """A prompt over the context raises BadRequestError with OpenAI's code context_length_exceeded."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="any", messages=TOO_LONG, max_tokens=4)
    assert refused.value.code == "context_length_exceeded"


def test_openai_responses_text_and_stream(client):
    """responses.create answers output_text; responses.stream's deltas add up to the same text."""
    ask = {"model": "any", "input": "Say hi in three words.", "max_output_tokens": 200, **GREEDY}
    whole = client.responses.create(**ask)
    with client.responses.stream(**ask) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()  # needs the response.completed event
    assert whole.status == "completed" and whole.output_text and deltas == whole.output_text
    assert final.output_text == whole.output_text


# -- anthropic ---------------------------------------------------------------------------------------------


def test_anthropic_text_stream_and_tool_round_trip(url):
    """messages.create, a stream of the same text, and tool_use -> tool_result -> a new message."""
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)
    text = client.messages.create(model="any", max_tokens=16, messages=HELLO, extra_body=GREEDY).content[0].text
    with client.messages.stream(model="any", max_tokens=16, messages=HELLO, extra_body=GREEDY) as stream:
        assert "".join(stream.text_stream) == text
    tools = [{"name": "get_weather", "description": "Get the current weather in a city", "input_schema": CITY}]
    call = client.messages.create(model="any", max_tokens=100, messages=WEATHER, tools=tools,
                                  tool_choice={"type": "any"}, extra_body=GREEDY)
    use = call.content[-1]
    assert call.stop_reason == "tool_use" and use.type == "tool_use" and isinstance(use.input["city"], str)
    answer = client.messages.create(model="any", max_tokens=60, tools=tools, extra_body=GREEDY, messages=[
        *WEATHER, {"role": "assistant", "content": call.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C, sunny"}]}])
    assert answer.type == "message" and answer.content and answer.stop_reason in ("end_turn", "tool_use", "max_tokens")


# -- ollama ------------------------------------------------------------------------------------------------


def test_ollama_chat_stream_json_and_tools(url):
    """ollama.Client: chat, a stream adding up to it, format json (an object), tools (a call with
    arguments as an object, or text), and a context overflow raising ResponseError."""
    ollama = pytest.importorskip("ollama", reason="the ollama package is not installed (pip install ollama)")
    client = ollama.Client(host=url, timeout=120)
    options = {"temperature": 0, "num_predict": 16}
    whole = client.chat(model="any", messages=HELLO, options=options)
    streamed = "".join(part.message.content for part in client.chat(model="any", messages=HELLO, options=options,
                                                                      stream=True))
    assert whole.message.content and streamed == whole.message.content
    mode = client.chat(model="any", messages=WEATHER, format="json", options={"temperature": 0, "num_predict": 60})
    assert isinstance(json.loads(mode.message.content), dict)
    tools = client.chat(model="any", messages=WEATHER, tools=[TOOL], options={"temperature": 0, "num_predict": 100})
    if tools.message.tool_calls:
        call = tools.message.tool_calls[0].function
        assert call.name == "get_weather" and isinstance(call.arguments, dict)
    else:
        assert tools.message.content
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model="any", messages=TOO_LONG, options={"num_predict": 4})  # one message: nothing to drop
    assert refused.value.status_code == 400 and "context" in refused.value.error


# -- langchain-openai --------------------------------------------------------------------------------------


def test_langchain_openai_chat_json_mode_and_tools(url):
    """ChatOpenAI: invoke, stream, with_structured_output json_mode (an object) and json_schema,
    bind_tools with a forced tool (a tool call with args)."""
    lc = pytest.importorskip("langchain_openai", reason="langchain-openai is not installed")
    chat = lc.ChatOpenAI(base_url=url + "/v1", api_key="unused", model="any", temperature=0, max_tokens=40,
                         max_retries=0, timeout=120)
    whole = chat.invoke("Say hello.")
    assert whole.content and "".join(c.content for c in chat.stream("Say hello.")) == whole.content
    person = {"title": "person", "description": "A person", **PERSON}
    chat = lc.ChatOpenAI(base_url=url + "/v1", api_key="unused", model="any", temperature=0, max_tokens=120,
                         max_retries=0, timeout=120)  # room for the whole object
    as_json = chat.with_structured_output(person, method="json_mode").invoke(
        "Return JSON with the keys name and age for Ada Lovelace.")
    assert isinstance(as_json, dict)
    as_schema = chat.with_structured_output(person, method="json_schema").invoke("Describe Ada Lovelace.")
    assert isinstance(as_schema["name"], str) and isinstance(as_schema["age"], int)
    called = chat.bind_tools([TOOL], tool_choice="get_weather").invoke("What is the weather in Paris?")
    assert called.tool_calls[0]["name"] == "get_weather" and isinstance(called.tool_calls[0]["args"]["city"], str)


# -- litellm -----------------------------------------------------------------------------------------------


def test_litellm_chat_stream_and_context_window(url):
    """litellm.completion through its openai/ provider: chat, a stream adding up to it, and a
    prompt over the context raising ContextWindowExceededError."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of the price list at import
    litellm = pytest.importorskip("litellm", reason="litellm is not installed")
    ask = {"model": "openai/any", "api_base": url + "/v1", "api_key": "unused", "max_tokens": 16, "temperature": 0,
           "num_retries": 0}
    whole = litellm.completion(messages=HELLO, **ask)
    streamed = "".join(c.choices[0].delta.content or "" for c in litellm.completion(messages=HELLO, stream=True, **ask))
    assert whole.choices[0].message.content and streamed == whole.choices[0].message.content
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(messages=TOO_LONG, **ask)


# -- instructor (optional) ---------------------------------------------------------------------------------


def test_instructor_json_mode(client):
    """instructor's JSON mode parses the answer into a pydantic model."""
    instructor = pytest.importorskip("instructor", reason="instructor is optional and not installed")
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    patched = instructor.from_openai(client, mode=instructor.Mode.JSON)
    person = patched.chat.completions.create(model="any", response_model=Person, max_tokens=60, max_retries=0,
                                             messages=[{"role": "user", "content": "Describe Ada Lovelace."}],
                                             **GREEDY)
    assert isinstance(person.name, str) and isinstance(person.age, int)
