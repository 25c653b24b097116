"""The Jinja environment chat templates run in, and one render into a bounded buffer.

Used inside the renderer process (template_worker.py), never in the process that serves or runs the
model. Owns: the sandbox (Jinja2's ImmutableSandboxedEnvironment: no underscore attributes, no
mutation of what a template is given, range() capped), the names Hugging Face templates expect
(raise_exception, strftime_now, tojson with its arguments, {% generation %}, loop controls),
rendering into a buffer that stops at the output budget, and describing any failure as a small
record (kind, message, template line) that can cross a pipe.
Does not own: the time and memory limits (the renderer process sets them on itself and
template_pool.py kills it past its deadline), choosing the template, or the messages users read
(chat.py).

The caps on `*` and `**` are not what keeps memory bounded (the process limit is); they turn the
most common runaway, `'x' * 10**10`, into a clear message instead of an out-of-memory one.
"""

from __future__ import annotations

import datetime
import json
import traceback
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

MAX_REPEAT = 1_000_000  # the longest string or list `*` may build in a template
MAX_MESSAGE = 500  # characters of an error message sent back (a message may quote a huge value)


class TemplateRaised(jinja2.TemplateError):
    """The template called raise_exception(message)."""


class OutputTooLarge(Exception):
    """The rendered text passed the output budget."""


class RenderTimeout(Exception):
    """Raised by the renderer's timer when the wall-clock budget is spent (an Exception, not a
    BaseException, so that Jinja maps it to the template line it interrupted)."""


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` (Hugging Face's assistant-mask marker): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox plus caps on `*` and `**` (clear messages for the common runaways)."""

    intercepted_binops = frozenset({"*", "**"})

    def unsafe_undefined(self, obj, attribute):
        """Fail at once on a forbidden attribute instead of rendering a silent empty value."""
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__} is not allowed")

    def call_binop(self, context, operator, left, right):
        if operator == "**":
            if isinstance(right, (int, float)) and abs(right) > 1000:
                raise SecurityError("exponent too large for a chat template")
            return left**right
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(count, int):
                if len(seq) * max(count, 0) > MAX_REPEAT:
                    raise SecurityError("repetition too large for a chat template")
        return left * right


def _raise_exception(message: str = "") -> None:
    raise TemplateRaised(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False,
            separators=None) -> str:
    """Hugging Face's tojson (not Jinja's HTML-escaping one): plain json.dumps with its arguments."""
    seps = tuple(separators) if separators is not None else None
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys, separators=seps)


def compile_template(source: str) -> jinja2.Template:
    """The template compiled in a fresh sandbox (raises jinja2.TemplateSyntaxError)."""
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, autoescape=False,
                   extensions=["jinja2.ext.loopcontrols", _GenerationTag])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render_bounded(template: jinja2.Template, context: dict, max_output: int) -> str:
    """The rendered text, stopping with OutputTooLarge as soon as it passes `max_output` characters."""
    pieces, size = [], 0
    for piece in template.generate(context):
        size += len(piece)
        if size > max_output:
            raise OutputTooLarge(f"the output passed {max_output} characters")
        pieces.append(piece)
    return "".join(pieces)


def failure(exc: BaseException) -> dict:
    """A failure as {"error": kind, "message": text, "line": template line or None}."""
    kinds = ((jinja2.TemplateSyntaxError, "syntax"), (TemplateRaised, "raised"), (SecurityError, "security"),
             (RecursionError, "recursion"), (MemoryError, "memory"), (RenderTimeout, "timeout"),
             (OutputTooLarge, "output"))
    kind = next((name for cls, name in kinds if isinstance(exc, cls)), "error")
    if kind == "syntax":
        return {"error": kind, "message": _short(exc.message or ""), "line": exc.lineno}
    message = str(exc) if kind in ("raised", "security") else f"{type(exc).__name__}: {exc}"
    return {"error": kind, "message": _short(message), "line": _template_line(exc)}


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + "..."


def _template_line(exc: BaseException) -> int | None:
    """The template line a rendering error happened on (Jinja maps template frames to '<template>')."""
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == "<template>":
            line = lineno
    return line
