"""Tools on a chat template with no place for them (SmolLM2's): llama.cpp's generic fallback, through
the OpenAI package, llama-server's /chat/completions and Ollama's /api/chat, whole and streamed; the
pieces (schema, reply parsing, streamed response text, rewritten history) on their own; a template
with its own call format keeps it; one that cannot take the system message answers 400."""

from __future__ import annotations

import json

import httpx

from kinetic.grammar import GrammarMatcher, TokenVocab, json_schema_grammar
from kinetic.server.generic_tools import RESPOND, GenericStream, generic_schema, messages_with_tools, parse_generic
from tests.conftest import model_path
from tests.grammar.helpers import full_match
from tests.server.live import openai_client_fixture, serving, url_fixture

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
# An earlier turn that called the tool: SmolLM2 then calls it again for a new city (greedy).
HISTORY = [{"role": "user", "content": "What is the weather in Berlin?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Berlin"}'}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "12 C, cloudy"},
           {"role": "assistant", "content": "It is 12 C and cloudy in Berlin."},
           {"role": "user", "content": "What is the weather in Paris?"}]
HELLO = [{"role": "user", "content": "Hi! How are you?"}]


url = url_fixture()
client = openai_client_fixture()


# -- the pieces ------------------------------------------------------------------------------------------


def test_generic_schema_holds_a_reply_to_a_call_or_a_response():
    """The grammar accepts a call of an offered tool with valid arguments, or a response string, and
    nothing else (prose, another tool's name, missing arguments)."""
    vocab = TokenVocab([bytes([b]) for b in range(256)] + [b""], eog_ids=[256])
    matcher = GrammarMatcher(json_schema_grammar(generic_schema(TOOLS, parallel=False)), vocab)
    for text in ['{"tool_call":{"name":"get_weather","arguments":{"city":"Paris"}}}',
                 '{ "tool_call": { "name": "get_weather", "arguments": { "city": "Paris" } } }',
                 '{"response":"Fine, thanks."}']:
        assert full_match(matcher, text), text
    for text in ["Fine, thanks.", '{"tool_call":{"name":"get_time","arguments":{}}}',
                 '{"tool_call":{"name":"get_weather","arguments":{}}}', '{"response":3}', '"hello"']:
        assert not full_match(matcher, text), text
    parallel = GrammarMatcher(json_schema_grammar(generic_schema(TOOLS, parallel=True)), vocab)
    assert full_match(parallel, '{"tool_calls":[{"name":"get_weather","arguments":{"city":"A"},"id":"c001"}]}')


def test_generic_reply_reads_back_into_calls_or_content():
    """A tool_call or tool_calls reply becomes calls, a response its text (a non-string response its
    JSON), anything else (an answer cut by max_tokens) stays content as written."""
    content, calls = parse_generic('{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}')
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]
    _, calls = parse_generic('{"tool_calls": [{"name": "a", "arguments": {}, "id": "1234"}, '
                             '{"name": "b", "arguments": {"x": 1}, "id": "5678"}]}')
    assert [c.name for c in calls] == ["a", "b"]
    assert parse_generic('{"response": "Hi \\u00e9"}') == ("Hi \u00e9", [])
    assert parse_generic('{"response": {"a": 1}}') == ('{"a": 1}', [])
    assert parse_generic('{"response": "cut \\u00') == ("cut ", [])
    assert parse_generic('{"tool_call": {"name": "get_') == ('{"tool_call": {"name": "get_', [])


def test_streamed_response_text_equals_the_whole_one_however_split():
    """GenericStream sends the response string as it is written, holding back a split escape, and
    its pieces add up to what parse_generic reads from the whole reply; calls come only at the end."""
    reply = '{ "response": "Caf\\u00e9 \\"ok\\"\\nline \\ud83d\\ude00 end" }'
    for whole in (reply, reply[:30]):  # and cut by max_tokens inside the string
        expected = parse_generic(whole)[0]
        for size in (1, 2, 3, 7):
            stream = GenericStream()
            sent = "".join(stream.feed(whole[i:i + size]) for i in range(0, len(whole), size))
            rest, calls = stream.finish()
            assert sent + rest == expected and not calls, size
    stream = GenericStream()
    assert stream.feed('{"tool_call": {"name": "get_weather", "arguments": {"city": "P"}}}') == ""
    assert stream.finish()[1][0].name == "get_weather"


def test_history_is_rewritten_and_the_system_message_joined():
    """The instruction and the tool list join an existing system message after a blank line; an
    earlier call becomes the assistant's JSON, a tool result a user message with tool_response."""
    out = messages_with_tools([{"role": "system", "content": "Be brief."}, *HISTORY[:3]], TOOLS)
    assert out[0]["content"].startswith("Be brief.\n\n" + RESPOND + "\n\nYou can call any of the following tools")
    assert json.loads(out[0]["content"].split("requests: ", 1)[1]) == TOOLS
    assert json.loads(out[2]["content"]) == {"tool_call": {"name": "get_weather", "arguments": {"city": "Berlin"}}}
    assert out[3]["role"] == "user"
    assert json.loads(out[3]["content"]) == {"tool_response": {"content": "12 C, cloudy", "tool_call_id": "call_1"}}
    assert messages_with_tools(HELLO, TOOLS)[0]["role"] == "system"
    two = {**HISTORY[1], "tool_calls": HISTORY[1]["tool_calls"] * 2}
    assert json.loads(messages_with_tools([two], TOOLS)[1]["content"]) == {"tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Berlin"}, "id": "call_1"}] * 2}


# -- through each API, on SmolLM2 ------------------------------------------------------------------------


def _messages(history):
    return [dict(m) for m in history]


def test_openai_auto_tools_come_back_as_tool_calls_whole_and_streamed(client):
    """tool_choice auto on SmolLM2: the reply parses into tool_calls (finish_reason tool_calls), and
    the stream carries the same call as a tool_calls delta."""
    whole = client.chat.completions.create(model="any", messages=_messages(HISTORY), tools=TOOLS, temperature=0,
                                           max_tokens=60)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)
    chunks = list(client.chat.completions.create(model="any", messages=_messages(HISTORY), tools=TOOLS,
                                                 temperature=0, max_tokens=60, stream=True))
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert [(d.function.name, d.function.arguments) for d in deltas] == [("get_weather", call.function.arguments)]
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_openai_auto_tools_answer_text_as_content_streamed_as_written(client, url):
    """When the model answers instead of calling, the response string is the content (not JSON),
    streamed in several deltas that add up to the whole answer."""
    whole = client.chat.completions.create(model="any", messages=HELLO, tools=TOOLS, temperature=0, max_tokens=60)
    assert RESPOND in httpx.get(url + "/slots", timeout=30).json()[0]["prompt"]
    text = whole.choices[0].message.content
    assert whole.choices[0].finish_reason == "stop" and text and not text.lstrip().startswith("{")
    chunks = list(client.chat.completions.create(model="any", messages=HELLO, tools=TOOLS, temperature=0,
                                                 max_tokens=60, stream=True))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    assert "".join(pieces) == text and len(pieces) > 1


def test_llama_server_chat_route_reads_the_same_calls(url, client):
    """llama-server's /chat/completions (no /v1) answers the same tool call."""
    body = {"messages": HISTORY, "tools": TOOLS, "temperature": 0, "max_tokens": 60}
    answer = httpx.post(url + "/chat/completions", json=body, timeout=120).json()
    calls = answer["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    assert answer["choices"][0]["finish_reason"] == "tool_calls"


def test_ollama_chat_returns_calls_with_object_arguments_whole_and_streamed(url):
    """/api/chat with tools: message.tool_calls with arguments as an object, whole and in the stream."""
    body = {"model": "any", "messages": HISTORY, "tools": TOOLS, "options": {"temperature": 0, "num_predict": 60}}
    whole = httpx.post(url + "/api/chat", json={**body, "stream": False}, timeout=120).json()
    calls = whole["message"]["tool_calls"]
    assert calls[0]["function"]["name"] == "get_weather" and isinstance(calls[0]["function"]["arguments"], dict)
    lines = [json.loads(line) for line in httpx.post(url + "/api/chat", json=body, timeout=120).text.splitlines()]
    streamed = [c for line in lines for c in line.get("message", {}).get("tool_calls", [])]
    assert streamed == calls and lines[-1]["done"] is True


# -- templates ---------------------------------------------------------------------------------------------

HERMES = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}. Call one as <tool_call>{...}</tool_call>"
          "<|im_end|>\n{% endif %}<|im_start|>assistant\n")
NO_SYSTEM = ("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
             "{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")


def _served_with_template(tmp_path, source: str):
    from kinetic.model import Model

    path = tmp_path / "template.jinja"
    path.write_text(source)
    return serving(Model(model_path("smollm2-135m"), n_ctx=512, threads=2, chat_template_file=path))


def test_a_template_with_its_own_call_format_keeps_it(tmp_path):
    """A template that writes <tool_call> gets the tools itself: no generic instruction in the prompt."""
    with _served_with_template(tmp_path, HERMES) as url:
        body = {"messages": HELLO, "tools": TOOLS, "max_tokens": 2, "temperature": 0}
        assert httpx.post(url + "/v1/chat/completions", json=body, timeout=120).status_code == 200
        prompt = httpx.get(url + "/slots", timeout=30).json()[0]["prompt"]
        assert "Tools: [" in prompt and RESPOND not in prompt


def test_a_template_that_refuses_the_system_message_answers_400_naming_tools(tmp_path):
    """Where even the fallback cannot apply, a 400 saying the model does not support tools, and why,
    on the OpenAI and Ollama routes."""
    with _served_with_template(tmp_path, NO_SYSTEM) as url:
        body = {"messages": HELLO, "tools": TOOLS, "max_tokens": 2}
        openai_answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        assert openai_answer.status_code == 400
        error = openai_answer.json()["error"]
        assert "does not support tools" in error["message"] and "System role" in error["message"]
        assert error["param"] == "tools"
        ollama = httpx.post(url + "/api/chat", json={**body, "stream": False}, timeout=120)
        assert ollama.status_code == 400 and "does not support tools" in ollama.json()["error"]
