"""Errors as each API family writes them, and the handlers that turn every failure into one.

Owns: ApiError (a status, a message naming the field, the field) and the three error shapes:
OpenAI's {"error": {"message", "type", "param", "code"}}, llama-server's {"error": {"code",
"message", "type"}} and Ollama's {"error": "..."}. A prompt longer than the context is
llama-server's exceed_context_size_error, with n_prompt_tokens and n_ctx, in the first two shapes.
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


class ApiError(Exception):
    """A request the server will not serve: HTTP status, message, and the field at fault. `kind`
    replaces the error type the status implies; `extra` adds fields to the error object."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None,
                 extra: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind
        self.extra = extra or {}


def context_exceeded(n_prompt_tokens: int, n_ctx: int, at_least: bool = False) -> ApiError:
    """llama-server's refusal of a prompt the context cannot hold; `at_least`: counted from the
    prompt's length in bytes, before tokenizing (fit.py)."""
    count = f"at least {n_prompt_tokens}" if at_least else str(n_prompt_tokens)
    return ApiError(400, f"the request ({count} tokens) exceeds the available context size ({n_ctx} tokens); send "
                         "a shorter prompt or start the server with a larger -c", param="prompt",
                    kind="exceed_context_size_error", extra={"n_prompt_tokens": n_prompt_tokens, "n_ctx": n_ctx})


def not_supported(field: str, what: str = "", param: str | None = None) -> ApiError:
    """A field Kinetic parses but cannot honour yet (grammars and the like): 400, naming it."""
    return ApiError(400, f"{field} is not supported yet{what}", param=param or field.split(" ")[0])


def error_body(path: str, status: int, message: str, param: str | None = None, kind: str | None = None,
               extra: dict | None = None) -> dict:
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
    return error_response(path_of(request), exc.status, exc.message, exc.param, kind=exc.kind, extra=exc.extra)


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
