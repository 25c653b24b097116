"""A chat answer read as the template taught the model to write it: reasoning, text, tool calls.

Owns: applying kinetic/frontend/output_parsing.py to a whole answer, and doing the same piece by
piece for streams (reasoning as it is written, text as it is written, tool calls whole at the end,
as docs/server.md describes for `tools`). Shared by the OpenAI and Ollama chat routes. When
tool_choice forced the calls, everything after the reasoning is read as calls. A reply in the
generic fallback's JSON (tool_format "generic": generic_tools.py) is read by that module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kinetic.frontend.output_parsing import ParsedReply, ToolCall, parse_reply, parse_tool_calls
from kinetic.server.generic_tools import GenericStream, parse_generic
from kinetic.server.prompts import GENERIC, ChatPrompt
from kinetic.server.textstream import TOOL_MARKERS, HoldBack, ReasoningSplitter


def parse_whole(text: str, prompt: ChatPrompt, tools: list[dict] | None) -> ParsedReply:
    if prompt.tool_format == GENERIC:
        content, calls = parse_generic(text)
        return ParsedReply(content=content, tool_calls=calls)
    if not prompt.thinks and prompt.tool_format is None:
        return ParsedReply(content=text)
    if not prompt.thinks:  # split_reasoning would still read a leading <think>; such templates never ask for one
        content, calls = parse_tool_calls(text, prompt.tool_format, tools)
        return ParsedReply(content=content, tool_calls=calls)
    return parse_reply(text, prompt.tool_format, tools, reasoning_started=prompt.reasoning_started)


@dataclass
class ReplyStream:
    """feed(text) -> (reasoning delta, content delta); finish() -> the last of both and the tool calls."""

    prompt: ChatPrompt
    tools: list[dict] | None = None
    _reasoning: ReasoningSplitter | None = None
    _markers: HoldBack | None = None
    _calls: str | None = None  # the answer from the first tool-call marker on, once one is seen
    _seen_text: bool = False
    _generic: GenericStream | None = None
    reasoning_text: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.prompt.tool_format == GENERIC:
            self._generic = GenericStream()
        elif self.prompt.thinks:
            self._reasoning = ReasoningSplitter(started=self.prompt.reasoning_started)
        if self.prompt.tool_format is not None:
            self._markers = HoldBack(TOOL_MARKERS.get(self.prompt.tool_format, ()))

    def feed(self, text: str) -> tuple[str, str]:
        if self._generic is not None:
            return "", self._generic.feed(text)
        reasoning, content = self._reasoning.feed(text) if self._reasoning else ("", text)
        return reasoning, self._content(content)

    def finish(self) -> tuple[str, str, list[ToolCall]]:
        if self._generic is not None:
            return "", *self._generic.finish()
        reasoning, content = self._reasoning.flush() if self._reasoning else ("", "")
        content = self._content(content)
        calls: list[ToolCall] = []
        if self._markers is not None:
            if self._calls is None:
                content += self._markers.flush()
            else:
                rest, calls = parse_tool_calls(self._calls, self.prompt.tool_format, self.tools)
                content += rest if calls else self._calls
        return reasoning, content, calls

    def _content(self, text: str) -> str:
        if self._markers is None or not text:
            return text
        if self._calls is not None or self.prompt.forced_calls:
            self._calls = (self._calls or "") + text
            return ""
        if self.prompt.tool_format == "llama3" and not self._seen_text and text.lstrip().startswith("{"):
            self._calls = text  # Llama 3 writes a call as a bare JSON object
            return ""
        self._seen_text = self._seen_text or bool(text.strip())
        released, marker = self._markers.feed(text)
        if marker is not None:
            self._calls = marker + self._markers.rest
        return released
