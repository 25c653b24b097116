"""Streamed-text scanners: stop strings, the reasoning block and tool-call markers, piece by piece."""

from __future__ import annotations

import pytest

from kinetic.frontend.output_parsing import split_reasoning
from kinetic.runtime.stop_strings import HoldBack
from kinetic.server.prompts import ChatPrompt
from kinetic.server.reply import ReplyStream, parse_whole
from kinetic.server.textstream import ReasoningSplitter


def feed_all(scanner, pieces):
    out, marker = [], None
    for piece in pieces:
        released, marker = scanner.feed(piece)
        out.append(released)
        if marker is not None:
            break
    return "".join(out), marker


@pytest.mark.parametrize("pieces", [["Hello", " wor", "ld. STOP here"], ["Hello world. S", "T", "OP", " here"],
                                    list("Hello world. STOP here")])
def test_stop_string_is_cut_wherever_the_pieces_split_it(pieces):
    """The text before a stop string comes out whole and the stop string never does, however split."""
    out, marker = feed_all(HoldBack(("STOP",)), pieces)
    assert (out, marker) == ("Hello world. ", "STOP")


def test_holdback_releases_text_that_cannot_become_a_marker():
    """Only a tail that could still grow into a marker waits; the rest goes out at once."""
    scanner = HoldBack(("</end>",))
    assert scanner.feed("abc </e") == ("abc ", None)
    assert scanner.feed("x and more") == ("</ex and more", None)
    assert scanner.feed("tail </") == ("tail ", None)
    assert scanner.flush() == "</"


def test_earliest_of_several_stop_strings_wins():
    """With several stop strings, the one that starts first ends the text."""
    out, marker = feed_all(HoldBack(("world", "lo w")), ["hello world"])
    assert (out, marker) == ("hel", "lo w")


@pytest.mark.parametrize("text,started", [
    ("<think>\nplan it\n</think>\n\nThe answer.", False),
    ("  <think>a</think>b", False),
    ("plan it</think>The answer.", True),
    ("No reasoning here.", False),
    ("<think>never closes", False),
])
def test_streamed_reasoning_split_equals_whole_split(text, started):
    """Splitting reasoning piece by piece gives what output_parsing.split_reasoning gives whole."""
    for size in (1, 2, 3, 7, len(text)):
        splitter = ReasoningSplitter(started=started)
        reasoning, content = "", ""
        for i in range(0, len(text), size):
            r, c = splitter.feed(text[i:i + size])
            reasoning, content = reasoning + r, content + c
        r, c = splitter.flush()
        reasoning, content = reasoning + r, content + c
        want_reasoning, want_content = split_reasoning(text, started=started)
        assert content == want_content
        assert reasoning.strip() == (want_reasoning or "")


def prompt(tool_format=None, thinks=False, started=False):
    return ChatPrompt(ids=(1,), text="", reasoning_started=started, thinks=thinks, tool_format=tool_format)


def stream_reply(p, text, size=3, tools=None):
    stream = ReplyStream(p, tools)
    reasoning, content = "", ""
    for i in range(0, len(text), size):
        r, c = stream.feed(text[i:i + size])
        reasoning, content = reasoning + r, content + c
    r, c, calls = stream.finish()
    return reasoning + r, content + c, calls


@pytest.mark.parametrize("fmt,text", [
    ("hermes", 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ("qwen35", "Let me check.<tool_call><function=get_weather><parameter=city>Paris</parameter>"
               "</function></tool_call>"),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
])
def test_streamed_tool_calls_equal_whole_parse(fmt, text):
    """Text before a call streams as written; the call arrives whole, as parsing the whole reply finds it."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    whole = parse_whole(text, prompt(fmt), tools)
    for size in (1, 4, len(text)):
        _, content, calls = stream_reply(prompt(fmt), text, size, tools)
        assert calls == whole.tool_calls and [c.name for c in calls] == ["get_weather"]
        assert content.strip() == whole.content.strip()


def test_reply_without_calls_streams_unchanged():
    """A template without a call format or reasoning passes the text through untouched."""
    assert stream_reply(prompt(), "Plain <tool_call> text") == ("", "Plain <tool_call> text", [])
