"""Errors as each API family writes them, and the handlers that turn every failure into one.

Owns: ApiError (a status, a message naming the field, the field) and the three error shapes:
OpenAI's {"error": {"message", "type", "param", "code"}}, llama-server's {"error": {"code",
"message", "type"}} and Ollama's {"error": "..."}. A prompt longer than the context
(ContextExceeded) is written as each API's own clients recognise it: OpenAI's code
context_length_exceeded with OpenAI's wording ("This model's maximum context length is N tokens",
the phrase litellm and LangChain match) on the OpenAI routes, llama-server's
exceed_context_size_error with n_prompt_tokens and n_ctx on its routes, Ollama's message on /api.
/v1/messages answers in Anthropic's shape, {"type": "error", "error": {"type", "message"}}, its
context overflow in Anthropic's words ("prompt is too long: N tokens > M maximum").
Any exception reaching Litestar becomes a JSON body with the right status; an unexpected one is
logged here with its traceback and answered 500 without it. Nothing a client sends reaches the
client as a Python traceback.
"""

from __future__ import annotations

import logging
import traceback

from litestar import Request, Response
from litestar.exceptions import HTTPException

log = logging.getLogger("kinetic.server")

ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    405: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error",
    415: "invalid_request_error", 431: "invalid_request_error", 500: "server_error", 501: "not_supported_error",
    503: "unavailable_error",
}

# llama-server's own routes answer errors in its shape (code = the HTTP status).
LLAMA_PATHS = frozenset({"/completion", "/completions", "/tokenize", "/detokenize", "/props", "/slots", "/metrics",
                         "/health", "/embedding", "/embeddings", "/infill", "/apply-template"})

# Anthropic's Messages API (anthropic_api.py) answers {"type": "error", "error": {"type", "message"}}.
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                   503: "overloaded_error"}


def is_anthropic(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


class ApiError(Exception):
    """A request the server will not serve: HTTP status, message, and the field at fault. `kind`
    replaces the error type the status implies; `extra` adds fields to the error object; `headers`
    go on the answer (a busy server's 503 says when to retry: Retry-After)."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None,
                 extra: dict | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind
        self.extra = extra or {}
        self.headers = headers or {}

    def body(self, path: str) -> dict:
        """The error as the API `path` belongs to writes it."""
        return error_body(path, self.status, self.message, self.param, self.kind, self.extra)


class ContextExceeded(ApiError):
    """A prompt the context cannot hold (it must leave room for one generated token), written in each
    API's own shape by `body`; `at_least`: counted from the prompt's length in bytes, before
    tokenizing (fit.py)."""

    def __init__(self, n_prompt_tokens: int, n_ctx: int, at_least: bool = False):
        count = f"at least {n_prompt_tokens}" if at_least else str(n_prompt_tokens)
        super().__init__(400, f"the request ({count} tokens) exceeds the available context size ({n_ctx} tokens); "
                              "send a shorter prompt or start the server with a larger -c", param="prompt",
                         kind="exceed_context_size_error", extra={"n_prompt_tokens": n_prompt_tokens, "n_ctx": n_ctx})
        self.count = count
        self.n_ctx = n_ctx

    def body(self, path: str) -> dict:
        if path.startswith("/api/"):  # Ollama's words when a prompt cannot be shortened to fit
            return {"error": f"the prompt is longer than the context length currently available to the model "
                             f"({self.count} tokens, context {self.n_ctx}); shorten the prompt or raise num_ctx"}
        if path in LLAMA_PATHS:
            return super().body(path)
        if is_anthropic(path):  # Anthropic's words, which its clients (Claude Code) look for
            return {"type": "error", "error": {"type": "invalid_request_error",
                                               "message": f"prompt is too long: {self.count} tokens > {self.n_ctx} "
                                                          "maximum (start the server with a larger -c)"}}
        return {"error": {"message": f"This model's maximum context length is {self.n_ctx} tokens. However, your "
                                     f"request has {self.count} prompt tokens, with no room left for an answer. "
                                     "Please reduce the length of the messages or start the server with a larger -c.",
                          "type": "invalid_request_error", "param": "prompt" if path.endswith("/completions")
                          and "chat" not in path else "messages", "code": "context_length_exceeded",
                          **self.extra}}


def context_exceeded(n_prompt_tokens: int, n_ctx: int, at_least: bool = False) -> ContextExceeded:
    return ContextExceeded(n_prompt_tokens, n_ctx, at_least)


def not_supported(field: str, what: str = "", param: str | None = None) -> ApiError:
    """A field Kinetic parses but cannot honour yet (grammars and the like): 400, naming it."""
    return ApiError(400, f"{field} is not supported yet{what}", param=param or field.split(" ")[0])


def error_body(path: str, status: int, message: str, param: str | None = None, kind: str | None = None,
               extra: dict | None = None) -> dict:
    if is_anthropic(path):
        return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500
                                                                       else "api_error"), "message": message}}
    kind = kind or ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    if path.startswith("/api/"):
        return {"error": message}
    if path in LLAMA_PATHS:
        return {"error": {"code": status, "message": message, "type": kind, **(extra or {})}}
    return {"error": {"message": message, "type": kind, "param": param, "code": None, **(extra or {})}}


def error_response(path: str, status: int, message: str, param: str | None = None,
                   headers: dict | None = None, kind: str | None = None, extra: dict | None = None) -> Response:
    return Response(error_body(path, status, message, param, kind, extra), status_code=status, headers=headers)


def path_of(request: Request) -> str:
    """The request's path, read from the ASGI scope: request.url parses the Host header, and a
    malformed one (`localhost:abc`) would turn any error answer into a 500."""
    return request.scope["path"]


def handle_api_error(request: Request, exc: ApiError) -> Response:
    return Response(exc.body(path_of(request)), status_code=exc.status, headers=exc.headers or None)


def handle_http_exception(request: Request, exc: HTTPException) -> Response:
    """Litestar's own refusals (no route, wrong method, body too large) in the API's shape."""
    status = exc.status_code
    path = path_of(request)
    messages = {404: f"no endpoint {path}", 405: f"{request.method} is not allowed on {path}",
                413: "the request body is too large"}
    message = messages.get(status) or str(exc.detail or "request refused")
    headers = {k: v for k, v in (exc.headers or {}).items() if k.lower() == "allow"}
    return error_response(path, status, message, headers=headers)


def handle_unexpected(request: Request, exc: Exception) -> Response:
    log.error("internal error on %s %s:\n%s", request.method, path_of(request),
              "".join(traceback.format_exception(exc)))
    return error_response(path_of(request), 500, f"internal error: {type(exc).__name__}")


EXCEPTION_HANDLERS = {ApiError: handle_api_error, HTTPException: handle_http_exception, Exception: handle_unexpected}
