"""First-run kernel compilation as progress (kinetic/cli/compile_progress.py): a line while numba
compiles, a summary after, nothing when everything came from the caches or stderr is not a terminal."""

from __future__ import annotations

import io

import numba

from kinetic.cli.compile_progress import CompileProgress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def compile_something(offset: int) -> None:
    """A numba function no cache holds: calling it compiles it."""
    numba.njit(lambda x: x + offset)(1)


def test_a_compilation_is_summed_up_on_a_terminal():
    """A numba compilation inside the context ends with one summary line on a terminal."""
    stream = Terminal()
    with CompileProgress.shown(stream):
        compile_something(1)
    text = stream.getvalue()
    *live, summary = text.split("\r")  # what stays on the screen: the live line (if shown) was erased
    assert all(part.startswith("compiling kernels for this CPU") or not part.strip() for part in live)
    assert summary.startswith("compiled ") and " for this CPU in " in summary and summary.endswith("skips this\n")
    assert text.count("\n") == 1


def test_nothing_when_nothing_compiles_or_not_a_terminal():
    """Cached or already compiled: nothing is written; on a pipe nothing is written either."""
    quiet = Terminal()
    with CompileProgress.shown(quiet):
        pass
    assert quiet.getvalue() == ""
    pipe = io.StringIO()
    with CompileProgress.shown(pipe):
        compile_something(2)
    assert pipe.getvalue() == ""
