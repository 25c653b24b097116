"""Streamed text, piece by piece: the reasoning block and tool-call markers.

Owns: pure, incremental text scanners that decide what part of a growing answer can be sent now,
built on the runtime's `HoldBack` (kinetic/runtime/stop_strings.py, which also holds back stop
strings), so a client sees text as soon as it is certain. Does not own tokens (the runtime's
generation loop maps released text back to tokens) nor response shapes (the API modules).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kinetic.runtime.stop_strings import HoldBack

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass
class ReasoningSplitter:
    """Splits a streamed reply into (reasoning, content) deltas, as output_parsing.split_reasoning
    splits a whole one: a reply that opens with <think> (or whose prompt opened it: `started`)
    reasons until </think>; whitespace around the block is dropped."""

    started: bool = False
    mode: str = field(default="")  # "" (undecided), "reasoning", "content"
    _head: str = ""
    _close: HoldBack = field(default_factory=lambda: HoldBack((THINK_CLOSE,)))
    _strip: bool = True  # drop leading whitespace of the section being written

    def __post_init__(self) -> None:
        self.mode = "reasoning" if self.started else ""

    def feed(self, text: str) -> tuple[str, str]:
        if self.mode == "":
            self._head += text
            head = self._head.lstrip()
            if head.startswith(THINK_OPEN):
                self.mode, text = "reasoning", head[len(THINK_OPEN):]
            elif THINK_OPEN.startswith(head):
                return "", ""  # whitespace or a partial <think> so far
            else:
                self.mode, text, self._strip = "content", self._head, False
        if self.mode == "content":
            return "", self._lstrip(text)
        released, marker = self._close.feed(text)
        reasoning = self._lstrip(released)
        if marker is None:
            return reasoning, ""
        self.mode, self._strip = "content", True
        return reasoning, self._lstrip(self._close.rest)

    def flush(self) -> tuple[str, str]:
        if self.mode == "":
            return "", self._head
        if self.mode == "reasoning":
            return self._lstrip(self._close.flush()), ""
        return "", ""

    def _lstrip(self, text: str) -> str:
        if self._strip:
            text = text.lstrip()
            self._strip = not text
        return text


# Where each tool-call format's calls begin (kinetic/frontend/output_parsing.py reads them).
TOOL_MARKERS = {
    "hermes": ("<tool_call>",),
    "qwen35": ("<tool_call>",),
    "lfm2": ("<|tool_call_start|>",),
    "mistral": ("[TOOL_CALLS]",),
    "llama3": ("<|python_tag|>",),
}
