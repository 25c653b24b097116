"""Output parsing: reasoning split and tool calls in each family's format."""

from __future__ import annotations

import pytest

from kinetic.frontend.output_parsing import (
    ToolCall,
    detect_tool_format,
    parse_reply,
    parse_tool_calls,
    split_reasoning,
)


def test_reasoning_split():
    """<think>...</think> becomes reasoning; the rest is the answer."""
    assert split_reasoning("<think>\nstep 1\n</think>\n\nParis.") == ("step 1", "Paris.")
    assert split_reasoning("Paris.") == (None, "Paris.")


def test_reasoning_opened_by_the_prompt():
    """When the template already wrote <think>, the reply only closes it."""
    assert split_reasoning("hmm\n</think>\nParis.", started=True) == ("hmm", "Paris.")


def test_reasoning_cut_off():
    """A block that never closes is all reasoning (the reply hit its length limit)."""
    assert split_reasoning("<think>still going") == ("still going", "")


def test_hermes_tool_calls():
    """Qwen 3 / Hermes: JSON inside <tool_call> tags, several allowed, text around kept."""
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
            '\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>')
    content, calls = parse_tool_calls(text, "hermes")
    assert content == "Let me check."
    assert calls == [ToolCall("get_weather", {"city": "Paris"}), ToolCall("get_time", {"tz": "CET"})]
    assert calls[0].arguments_json() == '{"city": "Paris"}'


def test_hermes_malformed_json_stays_content():
    text = "<tool_call>\n{not json}\n</tool_call>"
    assert parse_tool_calls(text, "hermes") == (text, [])


def test_qwen35_xml_tool_calls():
    """Qwen 3.5 / LFM3 XML: string parameters stay strings, others are read as JSON where they parse."""
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n<parameter=zip>\n10001\n</parameter>\n</function>\n</tool_call>")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                         "zip": {"type": "string"}}}}}]
    content, calls = parse_tool_calls(text, "qwen35", tools)
    assert content == ""
    assert calls == [ToolCall("get_weather", {"city": "New York", "days": 3, "zip": "10001"})]


def test_llama3_bare_json():
    """Llama 3: the whole reply is {"name", "parameters"}, optionally after <|python_tag|>."""
    call = ToolCall("get_weather", {"city": "Paris"})
    bare = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert parse_tool_calls(bare, "llama3") == ("", [call])
    assert parse_tool_calls('<|python_tag|>{"name": "get_weather", "arguments": {"city": "Paris"}}',
                            "llama3") == ("", [call])
    assert parse_tool_calls("The answer is {1, 2}.", "llama3") == ("The answer is {1, 2}.", [])


def test_mistral_both_formats():
    """Mistral: [TOOL_CALLS] followed by a JSON list, or (newer models) NAME[ARGS]{...}."""
    old = 'Sure. [TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]'
    assert parse_tool_calls(old, "mistral") == ("Sure.", [ToolCall("a", {"x": 1}), ToolCall("b", {})])
    new = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}'
    assert parse_tool_calls(new, "mistral") == ("", [ToolCall("get_weather", {"city": "Paris"}),
                                                     ToolCall("get_time", {})])


def test_lfm2_pythonic_calls():
    """LFM2: a Python-style call list between its markers, literals only."""
    text = 'ok <|tool_call_start|>[get_weather(city="Paris", days=2), ping()]<|tool_call_end|>'
    assert parse_tool_calls(text, "lfm2") == ("ok", [ToolCall("get_weather", {"city": "Paris", "days": 2}),
                                                     ToolCall("ping", {})])


def test_lfm2_refuses_code():
    """Anything but literal arguments is left as text: parsing never evaluates the model's output."""
    text = "<|tool_call_start|>[f(x=__import__('os').system('true'))]<|tool_call_end|>"
    assert parse_tool_calls(text, "lfm2") == (text, [])


def test_parse_reply_combines_both():
    text = '<think>need weather</think><tool_call>{"name": "w", "arguments": {}}</tool_call>'
    reply = parse_reply(text, tool_format="hermes")
    assert (reply.reasoning_content, reply.content) == ("need weather", "")
    assert reply.tool_calls == [ToolCall("w", {})]


@pytest.mark.parametrize(("source", "fmt"), [
    ("{{ '<tool_call>\\n<function=' }}", "qwen35"),
    ("{{ '<tool_call>' }}", "hermes"),
    ("{{ '[TOOL_CALLS]' }}", "mistral"),
    ("{{ '<|tool_call_start|>' }}", "lfm2"),
    ("{{ '<|python_tag|>' }}", "llama3"),
    ("plain", None),
])
def test_detect_tool_format(source, fmt):
    assert detect_tool_format(source) == fmt


def test_unknown_format_is_an_error():
    with pytest.raises(ValueError, match="unknown tool-call format"):
        parse_tool_calls("x", "nope")
