"""The exception type Kinetic raises for problems a user can fix, and the subclasses that name a kind.

A KineticError carries the message the CLI prints after ``kinetic: `` and a hint: the line that says
what to do. The CLI prints both and exits 1; the Python API raises it unchanged. The subclasses
(ModelFileError, SignatureRequiredError, and KtcError in kinetic.ktc) let callers tell kinds apart
and print the same way.
"""

from __future__ import annotations


class KineticError(RuntimeError):
    """A failure with a clear message and a line saying what to do. A RuntimeError, as the Python API
    documents for a model that cannot be loaded (seed 001, "Python")."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n{self.hint}"


class ModelFileError(KineticError):
    """A model file whose contents are refused on load: a value that is missing, of the wrong type or
    out of range, or tensors that do not fit the hyperparameters. `key` names the metadata key,
    tensor or section; `expected` says what would have been accepted."""

    def __init__(self, file: str | None, key: str, what: str, expected: str,
                 hint: str = "The file is damaged or was made by a faulty converter; get a good copy of the model."):
        super().__init__(f"{file + ': ' if file else ''}{key} {what}; expected {expected}", hint)
        self.key = key
        self.expected = expected


class SignatureRequiredError(KineticError):
    """A model refused because a signature by a given key was required and the file has none, has
    another signer's, or is a GGUF file (which cannot be signed)."""
