"""Forced tool calls: each template style's grammar accepts the calls its template writes, rejects
other functions, missing arguments and extra calls, and decoding by its mask gives replies that
output_parsing reads back as calls."""

from __future__ import annotations

import json

import pytest

from kinetic.frontend.output_parsing import ToolCall, parse_tool_calls
from kinetic.grammar import TOOL_STYLES, GrammarError, GrammarMatcher, tool_call_grammar
from tests.grammar.helpers import closing_bias, closing_steer, full_match, random_decode, validate

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]

ONE = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>',
    "qwen35": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n"
              "</parameter>\n</function>\n</tool_call>",
    "llama3": '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]',
    "lfm2": '<|tool_call_start|>[get_weather(city="Paris", days=2)]<|tool_call_end|>',
}
TWO = {
    "hermes": ONE["hermes"] + '\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>',
    "qwen35": ONE["qwen35"] + "\n<tool_call>\n<function=now>\n</function>\n</tool_call>",
    "llama3": '[{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}, '
              '{"name": "now", "parameters": {}}]',
    "mistral": ONE["mistral"][:-1] + ', {"name": "now", "arguments": {}}]',
    "lfm2": '<|tool_call_start|>[get_weather(city="Paris", days=2), now()]<|tool_call_end|>',
}
BAD = {
    "hermes": ['<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
               '<tool_call>\n{"name": "get_weather", "arguments": {"days": 2}}\n</tool_call>',
               '<tool_call>\n{"name": "get_weather", "arguments": {"city": "P", "days": 9}}\n</tool_call>'],
    "qwen35": ["<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
               "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>",
               "<tool_call>\n<function=get_weather>\n<parameter=town>\nP\n</parameter>\n</function>\n</tool_call>"],
    "llama3": ['{"name": "get_weather", "arguments": {"city": "Paris"}}', '{"name": "now"}'],
    "mistral": ['[TOOL_CALLS][]', '[TOOL_CALLS]{"name": "now", "arguments": {}}'],
    "lfm2": ['<|tool_call_start|>[get_weather("Paris")]<|tool_call_end|>',
             '<|tool_call_start|>[now(x=1)]<|tool_call_end|>'],
}


@pytest.mark.parametrize("style", TOOL_STYLES)
def test_template_calls_accepted_and_read_back(byte_matcher, style):
    """The calls a template writes match its grammar (two only when parallel), and output_parsing
    reads them back as the same calls."""
    single = byte_matcher(tool_call_grammar(TOOLS, style, parallel=False))
    parallel = byte_matcher(tool_call_grammar(TOOLS, style, parallel=True))
    assert full_match(single, ONE[style]) and full_match(parallel, ONE[style])
    assert full_match(parallel, TWO[style]) and not full_match(single, TWO[style])
    for text in BAD[style]:
        assert not full_match(parallel, text), text
    _, calls = parse_tool_calls(TWO[style], style, TOOLS)
    days = "2" if style == "qwen35" else 2
    assert [c.name for c in calls] == ["get_weather", "now"]
    assert calls[0].arguments == {"city": "Paris", "days": 2 if style != "qwen35" else json.loads(days)}


@pytest.mark.parametrize("style", TOOL_STYLES)
def test_named_function_only(byte_matcher, style):
    """A named tool_choice holds the reply to that function alone."""
    matcher = byte_matcher(tool_call_grammar(TOOLS, style, only="now"))
    assert not full_match(matcher, ONE[style])
    now = TWO[style].replace(ONE[style], "").strip() if style in ("hermes", "qwen35") else None
    if now:
        assert full_match(matcher, now)


def test_think_block(byte_matcher):
    """think="optional" allows one whole <think> block before the call; think="open" needs the
    reasoning the prompt opened to be closed first."""
    optional = byte_matcher(tool_call_grammar(TOOLS, "hermes", think="optional"))
    assert full_match(optional, ONE["hermes"])
    assert full_match(optional, "<think>\nThe user wants <b>weather</b>.\n</think>\n\n" + ONE["hermes"])
    assert not full_match(optional, "<think>a</think></think>" + ONE["hermes"])
    opened = byte_matcher(tool_call_grammar(TOOLS, "hermes", think="open"))
    assert full_match(opened, "so, Paris.\n</think>\n\n" + ONE["hermes"])
    assert not full_match(opened, ONE["hermes"])


@pytest.mark.parametrize("kwargs, problem", [
    ({"tools": TOOLS, "style": None}, "tool-call format is not known"),
    ({"tools": TOOLS, "style": "chatml"}, "unknown tool-call format 'chatml'"),
    ({"tools": [], "style": "hermes"}, "non-empty list of tools"),
    ({"tools": [{"type": "function", "function": {}}], "style": "hermes"}, "tools[0] has no function name"),
    ({"tools": TOOLS, "style": "hermes", "only": "get_time"}, "'get_time', which is not among the tools"),
    ({"tools": [{"function": {"name": "get-weather"}}], "style": "lfm2"}, "cannot be written as a Python call"),
    ({"tools": [{"function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"not": {}}}}}}],
      "style": "hermes"}, "schema error at tools[0].function.parameters/properties/a: 'not' is not supported"),
])
def test_errors(kwargs, problem):
    """Forced calls that cannot be built raise GrammarError saying why."""
    with pytest.raises(GrammarError, match=None) as info:
        tool_call_grammar(**kwargs)
    assert problem in str(info.value)


@pytest.mark.parametrize("style", TOOL_STYLES)
def test_decoding_by_mask_gives_calls(smol_vocab, smol_tokenizer, style):
    """Decoding random logits under the mask ends in a reply that output_parsing reads as calls to
    known functions with their required arguments (valid against the schema in the JSON styles),
    with nothing else in the reply."""
    matcher = GrammarMatcher(tool_call_grammar(TOOLS, style, parallel=True), smol_vocab)
    bias = closing_bias(smol_vocab)
    # free-text values (qwen35) end only with this markup: steer toward it as a model would
    steer = closing_steer(smol_vocab, b"\n</parameter>\n</function>\n</tool_call>") if style == "qwen35" else None
    finished = 0
    for seed in range(6):
        ids, ended = random_decode(matcher, seed, bias, steer=steer)
        if not ended:
            continue
        finished += 1
        content, calls = parse_tool_calls(smol_tokenizer.decode(ids), style, TOOLS)
        assert content == "" and calls
        for call in calls:
            assert isinstance(call, ToolCall) and call.name in ("get_weather", "now")
            schema = WEATHER if call.name == "get_weather" else TOOLS[1]["function"]["parameters"]
            if style == "qwen35":
                assert set(schema.get("required", [])) <= call.arguments.keys() <= schema["properties"].keys()
            else:
                assert validate(call.arguments, schema) == [], call
    assert finished >= 3
