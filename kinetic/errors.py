"""The one exception type Kinetic raises for problems a user can fix.

A KineticError carries the message the CLI prints after ``kinetic: `` and a hint: the line that says
what to do. The CLI prints both and exits 1; the Python API raises it unchanged.
"""

from __future__ import annotations


class KineticError(Exception):
    """A failure with a clear message and a line saying what to do."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n{self.hint}"
