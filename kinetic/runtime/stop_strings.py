"""Stop strings in streamed text: `HoldBack`, which releases a growing answer piece by piece and
holds back only the tail that could still become a marker.

Owns: the incremental marker scan (pure, text only). Does not own tokens (kinetic/runtime/generation.py
maps released text back to tokens) nor what a marker means to an API (the server's textstream.py
uses the same scanner for tool-call markers and the reasoning block).
"""

from __future__ import annotations

from dataclasses import dataclass


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
