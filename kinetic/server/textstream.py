"""Streamed text, piece by piece: stop strings, the reasoning block, tool-call markers.

Owns: pure, incremental text scanners that decide what part of a growing answer can be sent now.
A scanner holds back only the tail that could still turn into a marker, so a stop string is never
sent and a client sees text as soon as it is certain. Does not own tokens (the engine worker maps
released text back to tokens) nor response shapes (the API modules).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class HoldBack:
    """Finds the first of `markers` in text fed piece by piece.

    feed(text) returns (released, marker): the text that can go out now and the marker found, if
    any. Once a marker is found, `released` is everything before it and `rest` keeps what followed
    it; the caller stops feeding (a stop string) or switches to buffering (a tool call).
    """

    markers: tuple[str, ...]
    pending: str = ""
    rest: str = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        self.pending += text
        found = [(self.pending.find(m), m) for m in self.markers if m]
        found = [(pos, m) for pos, m in found if pos >= 0]
        if found:
            pos, marker = min(found)
            released, self.rest = self.pending[:pos], self.pending[pos + len(marker):]
            self.pending = ""
            return released, marker
        keep = self._partial_tail()
        cut = len(self.pending) - keep
        released, self.pending = self.pending[:cut], self.pending[cut:]
        return released, None

    def flush(self) -> str:
        """The held-back tail, at the end of the answer (it never became a marker)."""
        text, self.pending = self.pending, ""
        return text

    def _partial_tail(self) -> int:
        """Length of the longest tail of pending that is the start of a marker (the leftmost place a
        marker could begin is the longest; only places holding its first character are tried)."""
        best, pending = 0, self.pending
        for marker in self.markers:
            i = pending.find(marker[0], max(0, len(pending) - len(marker) + 1))
            while i != -1 and len(pending) - i > best:
                if marker.startswith(pending[i:]):
                    best = len(pending) - i
                    break
                i = pending.find(marker[0], i + 1)
        return best


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
