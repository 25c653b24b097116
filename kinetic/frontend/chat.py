"""Chat templates: the model's own Jinja template, rendered in a sandbox the template cannot leave.

Owns: choosing the template (a `--chat-template-file` override, the file's
`tokenizer.chat_template`, or ChatML as llama.cpp falls back to), the names Hugging Face templates
expect (messages, add_generation_prompt, bos_token, eos_token, tools, raise_exception,
strftime_now, tojson with its arguments, chat_template_kwargs such as enable_thinking), and turning
every failure into a KineticError that names the template line.
Does not own: tokenizing the rendered text (tokenizer), reading replies (output_parsing).

Safety: templates come from downloaded files, so they are untrusted code. They run in Jinja2's
ImmutableSandboxedEnvironment (no underscore attributes, no mutation of what they are given, range()
capped), with `*` and `**` capped so a template cannot ask for gigabytes; no Python function is
exposed beyond the few listed above.
"""

from __future__ import annotations

import datetime
import json
import traceback
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from kinetic.errors import KineticError

# What llama.cpp renders when the file has no template (common/chat.cpp's ChatML source).
CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}\n"
)

MAX_REPEAT = 1_000_000  # the longest string or list `*` may build in a template
MAX_OUTPUT = 16 * 1024 * 1024  # characters; no real prompt comes near it
_FIX_HINT = "Check the chat template (or pass --chat-template-file with a corrected one)."


class TemplateRaised(jinja2.TemplateError):
    """The template called raise_exception(message)."""


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` (Hugging Face's assistant-mask marker): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox plus caps on `*` and `**`, the two ways to ask for unbounded memory."""

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


def _environment() -> jinja2.Environment:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, autoescape=False,
                   extensions=["jinja2.ext.loopcontrols", _GenerationTag])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template with the BOS/EOS texts it is rendered with."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", origin: str = "chat template"):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.origin = origin
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            message = f"{origin}: syntax error at line {exc.lineno}: {exc.message}"
            raise KineticError(message, _FIX_HINT) from None

    @classmethod
    def from_string(cls, text: str, bos_token: str = "", eos_token: str = "") -> ChatTemplate:
        return cls(text, bos_token=bos_token, eos_token=eos_token)

    @classmethod
    def from_gguf(cls, gguf_file, override_path: str | Path | None = None) -> ChatTemplate:
        """The override file if given, else the file's template, else ChatML (as llama.cpp does)."""
        meta = gguf_file.metadata
        bos, eos = _token_text(meta, "bos"), _token_text(meta, "eos")
        if override_path is not None:
            path = Path(override_path)
            try:
                source = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise KineticError(f"cannot read chat template file {path}: {exc.strerror or exc}",
                                   "Check the --chat-template-file path.") from None
            return cls(source, bos, eos, origin=f"chat template {path.name}")
        source = meta.get("tokenizer.chat_template")
        if isinstance(source, str) and source.strip():
            return cls(source, bos, eos)
        return cls(CHATML_TEMPLATE, bos, eos, origin="ChatML fallback template")

    @property
    def is_chatml_fallback(self) -> bool:
        return self.source == CHATML_TEMPLATE

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools: list | None = None,
               **template_kwargs: Any) -> str:
        """The prompt text for `messages`; extra keywords (enable_thinking=False, ...) reach the template."""
        context = {"bos_token": self.bos_token, "eos_token": self.eos_token, **template_kwargs,
                   "messages": _plain(messages), "tools": _plain(tools),
                   "add_generation_prompt": add_generation_prompt}
        try:
            text = self._template.render(context)
        except TemplateRaised as exc:
            raise self._error(exc, f"the template refused the conversation: {exc}") from None
        except SecurityError as exc:
            raise self._error(exc, f"the template tried something the sandbox forbids: {exc}") from None
        except RecursionError as exc:
            raise self._error(exc, "the template recursed too deeply") from None
        except Exception as exc:  # any other failure inside untrusted template code
            raise self._error(exc, f"{type(exc).__name__}: {exc}") from None
        if len(text) > MAX_OUTPUT:
            message = f"{self.origin} produced {len(text)} characters, more than {MAX_OUTPUT}"
            raise KineticError(message, _FIX_HINT)
        return text

    def _error(self, exc: BaseException, what: str) -> KineticError:
        line = _template_line(exc)
        where = f" at line {line}" if line else ""
        return KineticError(f"{self.origin}{where}: {what}", _FIX_HINT)


def _template_line(exc: BaseException) -> int | None:
    """The template line a rendering error happened on (Jinja maps template frames to '<template>')."""
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == "<template>":
            line = frame.lineno
    return line


def _plain(value: Any) -> Any:
    """A copy made only of dicts, lists and scalars, so the template never sees caller objects."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if hasattr(value, "model_dump"):  # pydantic request objects from the server
        return _plain(value.model_dump())
    raise KineticError(f"a chat message holds a {type(value).__name__}, which templates cannot use",
                       "Pass messages as dicts of strings, numbers, lists and dicts.")


def _token_text(meta, which: str) -> str:
    token_id = meta.get(f"tokenizer.ggml.{which}_token_id")
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(token_id, int) and tokens is not None and 0 <= token_id < len(tokens):
        return tokens[token_id]
    return ""
