"""Chat templates: the model's own Jinja template, rendered in a sandbox the template cannot leave,
inside a budget it cannot exceed.

Owns: choosing the template (a `--chat-template-file` override, the file's
`tokenizer.chat_template`, or ChatML as llama.cpp falls back to), reading an override file safely
(a regular file of at most 1 MiB of UTF-8 text), the names Hugging Face templates expect (messages,
add_generation_prompt, bos_token, eos_token, tools, chat_template_kwargs such as enable_thinking),
and turning every failure into a KineticError that names the template line.
Does not own: the sandbox (template_sandbox.py), the renderer processes and the budget's
enforcement (template_pool.py, template_worker.py), tokenizing the rendered text (tokenizer),
reading replies (output_parsing).

Safety: templates come from downloaded files, so they are untrusted code. They are compiled and
rendered in a separate renderer process, in Jinja2's ImmutableSandboxedEnvironment, within a
RenderBudget (default: 2 s of wall clock, 16 MiB of output, 512 MiB of memory) that the process
limits enforce whatever the template does; template_pool.py says why a process and not a metering
sandbox. The template receives a JSON copy of the messages, so it never sees caller objects.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from kinetic.errors import KineticError
from kinetic.frontend.template_pool import DEFAULT_BUDGET, POOL, Cancel, RenderBudget, RenderCancelled

__all__ = ["BUILTIN_TEMPLATES", "CHATML_TEMPLATE", "ChatTemplate", "DEFAULT_BUDGET", "MAX_TEMPLATE_BYTES",
           "RenderBudget", "RenderCancelled", "read_template_file"]

# What llama.cpp renders when the file has no template (common/chat.cpp's ChatML source).
CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}\n"
)

# The templates llama.cpp's --chat-template NAME can name here (its other names are not built in).
BUILTIN_TEMPLATES = {"chatml": CHATML_TEMPLATE}

MAX_TEMPLATE_BYTES = 1024 * 1024  # real templates are a few KiB to a few tens of KiB
_FIX_HINT = "Check the chat template (or pass --chat-template-file with a corrected one)."
_FAILURES = {  # a renderer's failure kind -> what the user reads after "chat template at line N: "
    "raised": "the template refused the conversation: {message}",
    "security": "the template tried something the sandbox forbids: {message}",
    "recursion": "the template recursed too deeply",
    "error": "{message}",
    "timeout": "the template ran longer than its time budget of {budget.timeout_s:g} s",
    "output": "the template's output passed its budget of {budget.max_output_chars} characters",
    "memory": "the template needed more than its memory budget of {mib} MiB",
    "stopped": "the template renderer stopped before finishing ({message})",
}


def read_template_file(path: str | os.PathLike) -> str:
    """A template file's text: a regular file of at most MAX_TEMPLATE_BYTES of UTF-8 without NUL bytes."""
    path = Path(path)
    hint = "Check the --chat-template-file path: it should name a Jinja text file."
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
    except OSError as exc:
        raise KineticError(f"cannot read chat template file {path}: {exc.strerror or exc}", hint) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise KineticError(f"chat template file {path} is not a regular file (a directory, device or pipe)",
                               hint)
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_TEMPLATE_BYTES + 1)
    except OSError as exc:
        raise KineticError(f"cannot read chat template file {path}: {exc.strerror or exc}", hint) from None
    finally:
        os.close(fd)
    if len(data) > MAX_TEMPLATE_BYTES:
        raise KineticError(f"chat template file {path} is larger than {MAX_TEMPLATE_BYTES // 1024} KiB", hint)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KineticError(f"chat template file {path} is not UTF-8 text (invalid byte at offset {exc.start})",
                           hint) from None
    if "\0" in text:
        raise KineticError(f"chat template file {path} holds NUL bytes: it is a binary file, not a template", hint)
    return text


class ChatTemplate:
    """A chat template (checked by compiling it in a renderer) with the BOS/EOS texts it is rendered
    with and the budget every render runs in."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", origin: str = "chat template",
                 budget: RenderBudget = DEFAULT_BUDGET):
        if len(source.encode("utf-8", "surrogatepass")) > MAX_TEMPLATE_BYTES:
            raise KineticError(f"{origin} is larger than {MAX_TEMPLATE_BYTES // 1024} KiB", _FIX_HINT)
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.origin = origin
        self.budget = budget
        self._run(None, cancel=None)  # a syntax error surfaces now, not on the first render

    @classmethod
    def from_string(cls, text: str, bos_token: str = "", eos_token: str = "",
                    budget: RenderBudget = DEFAULT_BUDGET) -> ChatTemplate:
        return cls(text, bos_token=bos_token, eos_token=eos_token, budget=budget)

    @classmethod
    def from_gguf(cls, gguf_file, override_path: str | Path | None = None,
                  budget: RenderBudget = DEFAULT_BUDGET) -> ChatTemplate:
        """The override file if given, else the file's template, else ChatML (as llama.cpp does)."""
        meta = gguf_file.metadata
        bos, eos = _token_text(meta, "bos"), _token_text(meta, "eos")
        if override_path is not None:
            source = read_template_file(override_path)
            return cls(source, bos, eos, origin=f"chat template {Path(override_path).name}", budget=budget)
        source = meta.get("tokenizer.chat_template")
        if isinstance(source, str) and source.strip():
            return cls(source, bos, eos, budget=budget)
        return cls(CHATML_TEMPLATE, bos, eos, origin="ChatML fallback template", budget=budget)

    @property
    def is_chatml_fallback(self) -> bool:
        return self.source == CHATML_TEMPLATE

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools: list | None = None,
               **template_kwargs: Any) -> str:
        """The prompt text for `messages`; extra keywords (enable_thinking=False, ...) reach the template."""
        return self.render_cancellable(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                       template_kwargs=template_kwargs)

    def render_cancellable(self, messages: list[dict], *, cancel: Cancel | None = None,
                           add_generation_prompt: bool = True, tools: list | None = None,
                           template_kwargs: dict | None = None) -> str:
        """render() for callers that may stop waiting: `cancel` is polled every 50 ms while the renderer
        works; once it returns True (RenderCancelled) or raises (its exception propagates) the renderer
        is killed. Blocks its thread: a server calls it from a worker thread."""
        context = {"bos_token": self.bos_token, "eos_token": self.eos_token, **_plain(template_kwargs or {}),
                   "messages": _plain(messages), "tools": _plain(tools),
                   "add_generation_prompt": add_generation_prompt}
        answer = self._run(context, cancel)
        if not isinstance(answer.get("text"), str):
            raise self._error({"error": "stopped", "message": "it sent no text"})
        return answer["text"]

    def _run(self, context: dict | None, cancel: Cancel | None) -> dict:
        answer = POOL.run(_encode(self.budget.request(self.source, context)), self.budget, cancel)
        if "error" in answer:
            raise self._error(answer)
        return answer

    def _error(self, failure: dict) -> KineticError:
        kind, message, line = failure.get("error"), str(failure.get("message", "")), failure.get("line")
        where = f" at line {line}" if isinstance(line, int) else ""
        if kind == "syntax":
            return KineticError(f"{self.origin}: syntax error{where}: {message}", _FIX_HINT)
        what = _FAILURES.get(kind, _FAILURES["error"]).format(
            message=message, budget=self.budget, mib=self.budget.max_memory_bytes // (1024 * 1024))
        return KineticError(f"{self.origin}{where}: {what}", _FIX_HINT)


def _encode(request: dict) -> bytes:
    """The request as UTF-8 JSON (lone surrogates kept, as a JSON request body can carry them)."""
    try:
        return json.dumps(request, ensure_ascii=False).encode("utf-8", "surrogatepass")
    except (ValueError, RecursionError) as exc:  # ints past Python's digit limit, nesting past the stack
        raise KineticError(f"the chat messages cannot be given to the template: {exc}",
                           "Pass messages as dicts of strings, numbers, lists and dicts.") from None


def _plain(value: Any) -> Any:
    """A copy made only of dicts, lists and scalars, so the template never sees caller objects."""
    try:
        return _plain_copy(value)
    except RecursionError:
        raise KineticError("the chat messages nest too deeply for a template",
                           "Pass messages as dicts of strings, numbers, lists and dicts.") from None


def _plain_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_copy(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if hasattr(value, "model_dump"):  # pydantic request objects from the server
        return _plain_copy(value.model_dump())
    raise KineticError(f"a chat message holds a {type(value).__name__}, which templates cannot use",
                       "Pass messages as dicts of strings, numbers, lists and dicts.")


def _token_text(meta, which: str) -> str:
    token_id = meta.get(f"tokenizer.ggml.{which}_token_id")
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(token_id, int) and tokens is not None and 0 <= token_id < len(tokens):
        return tokens[token_id]
    return ""
