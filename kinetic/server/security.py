"""Who may use the server: the API key, web pages from other sites, DNS rebinding.

Owns: one ASGI middleware run before every route. With --api-key, every route but /health and the
chat page's files (page.py) needs `Authorization: Bearer KEY` or `X-Api-Key: KEY` (401 otherwise).
A request a browser sends from a page whose Origin is not allowed is refused (403): allowed are
this computer (localhost, loopback addresses and 0.0.0.0, any port), the server's own Host,
Ollama's default app and editor origins (app://*, file://*, tauri://*, vscode-webview://*,
vscode-file://*: Ollama's envconfig.AllowedOrigins) and the patterns of --allowed-origins ($KINETIC_ORIGINS, plus
$OLLAMA_ORIGINS), each an origin with at most one `*` wildcard, or `*` for every origin. While the
server listens on a loopback address the Host header must name this computer too, so a web page
that rebinds its own domain name to 127.0.0.1 cannot reach it. Allowed pages get CORS headers.
Every header is read as Latin-1 text and a value that does not parse (an Origin or Host that is
not a URL) is treated as foreign: refused with a 403, never a 500.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from urllib.parse import urlsplit

from kinetic.server.errors import error_body
from kinetic.server.options import ServerOptions
from kinetic.server.page import PAGE_PATHS

OPEN_PATHS = frozenset({"/health", "/v1/health"}) | PAGE_PATHS  # the chat page loads, then asks for the key
MAX_HEADER_BYTES = 16 * 1024  # all request headers together; beyond: 431
# Ollama's default allowances for desktop apps, editors and local files (envconfig.AllowedOrigins).
APP_ORIGINS = ("app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*")
ORIGIN_VARIABLES = ("KINETIC_ORIGINS", "OLLAMA_ORIGINS")


def origin_patterns(flag: str | None, environ) -> tuple[str, ...]:
    """--allowed-origins (else $KINETIC_ORIGINS), plus $OLLAMA_ORIGINS: comma-separated patterns."""
    lists = [flag if flag is not None else environ.get("KINETIC_ORIGINS", ""), environ.get("OLLAMA_ORIGINS", "")]
    return tuple(p.strip() for text in lists for p in text.split(",") if p.strip())


def origin_matches(origin: str, pattern: str) -> bool:
    """`pattern` an origin, `*` for any, or an origin with one `*` standing for any text (as Ollama's
    CORS settings read it); letters' case does not matter."""
    origin, pattern = origin.lower(), pattern.lower()
    if pattern == "*":
        return True
    head, star, tail = pattern.partition("*")
    if not star:
        return origin == pattern
    return len(origin) >= len(head) + len(tail) and origin.startswith(head) and origin.endswith(tail)


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _hostname(authority: str) -> str:
    """The host part of a Host header (port dropped, IPv6 brackets kept off); "" when malformed."""
    try:
        return urlsplit("//" + authority).hostname or ""
    except ValueError:
        return ""


def _origin_host(origin: str) -> str | None:
    """The host of an Origin header; None for "null" and for one that is not a URL (`http://[::1`),
    which is refused like a page from another site, never a 500."""
    if origin == "null":
        return None
    try:
        return urlsplit(origin).hostname
    except ValueError:
        return None


class Guard:
    """The ASGI middleware: refuses before a handler runs; otherwise adds CORS headers for local pages."""

    def __init__(self, app, options: ServerOptions):
        self.app = app
        self.options = options
        self.local_only = is_loopback(options.host)
        self.patterns = APP_ORIGINS + options.allowed_origins

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        origin = headers.get("origin")
        refusal = self._refusal(scope, headers, origin)
        if refusal is not None:
            return await _send_error(send, scope["path"], *refusal)
        if origin is None:
            return await self.app(scope, receive, send)
        cors = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
        if scope["method"] == "OPTIONS":  # a browser's preflight from a page on this computer
            allow = [(b"access-control-allow-methods", b"GET, POST, OPTIONS"),
                     (b"access-control-allow-headers", b"Authorization, Content-Type, X-Api-Key"),
                     (b"access-control-max-age", b"600")]
            await send({"type": "http.response.start", "status": 204, "headers": cors + allow})
            return await send({"type": "http.response.body", "body": b""})

        async def send_with_cors(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", [])) + cors}
            await send(message)

        return await self.app(scope, receive, send_with_cors)

    def _refusal(self, scope, headers: dict, origin: str | None) -> tuple[int, str] | None:
        if sum(len(k) + len(v) for k, v in scope.get("headers", [])) > MAX_HEADER_BYTES:
            return 431, f"the request headers are larger than {MAX_HEADER_BYTES} bytes"
        host = _hostname(headers.get("host", ""))
        if self.local_only and headers.get("host") is not None and not is_loopback(host):
            return 403, f"this server answers requests to this computer only, not to {host or 'that host'}"
        if origin is not None and not self._origin_allowed(origin, host):
            return 403, ("requests from web pages on other sites are refused; allow this one with "
                         "kinetic serve --allowed-origins (or KINETIC_ORIGINS)")
        key = self.options.api_key
        if key and scope["path"] not in OPEN_PATHS and scope["method"] != "OPTIONS":
            given = headers.get("x-api-key") or ""
            auth = headers.get("authorization", "")
            if auth[:7].lower() == "bearer ":
                given = auth[7:].strip()
            if not hmac.compare_digest(given.encode(), key.encode()):
                return 401, "a valid API key is required: send Authorization: Bearer KEY or X-Api-Key: KEY"
        return None


    def _origin_allowed(self, origin: str, host: str) -> bool:
        if any(origin_matches(origin, p) for p in self.patterns):
            return True
        origin_host = _origin_host(origin)
        return origin_host is not None and (is_loopback(origin_host) or origin_host == "0.0.0.0"
                                            or origin_host == host)


async def _send_error(send, path: str, status: int, message: str) -> None:
    body = json.dumps(error_body(path, status, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
