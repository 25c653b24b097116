"""The chat page: `/` in a browser, its script and style sheet, and `/v1` sending a browser there.

Owns: serving the three static files shipped in kinetic/server/static (no build step, no outside
framework: the page talks to /v1/chat/completions itself) with a strict Content-Security-Policy
(scripts, styles and connections from this server only, no inline code, no frames), and what `/`
and `/v1` answer to a program rather than a browser: `/` stays Ollama's plain "Kinetic is
running" (apps probe it), `/v1` the API's 404 in OpenAI's shape. A request is a browser's when its
Accept header names text/html. The page paths need no API key (security.py), so the page can load
and ask for one; everything it calls does. Does not own the conversation (kept by the page in the
browser's localStorage) nor the chat route it calls.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from litestar import Request, Response, get
from litestar.response import Redirect

from kinetic.server.errors import ApiError

STATIC = {"chat.js": "text/javascript", "chat.css": "text/css"}
PAGE_PATHS = frozenset({"/", "/v1", "/v1/", *(f"/static/{name}" for name in STATIC)})
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
                "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


@cache
def _file(name: str) -> bytes:
    return resources.files("kinetic.server").joinpath("static", name).read_bytes()


def wants_html(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "").lower()


@get(["/"], sync_to_thread=False)
def root(request: Request) -> Response:
    if not wants_html(request):
        return Response("Kinetic is running", media_type="text/plain", headers={"Cache-Control": "no-cache"})
    return Response(_file("index.html"), media_type="text/html", headers=PAGE_HEADERS)


@get(["/static/{name:str}"], sync_to_thread=False)
def static(request: Request) -> Response:
    name = request.path_params["name"]  # read here: a declared path parameter is deprecated in Litestar 2.2x
    if name not in STATIC:
        raise ApiError(404, f"no file /static/{name}")
    return Response(_file(name), media_type=STATIC[name], headers=PAGE_HEADERS)


@get(["/v1"], sync_to_thread=False)
def v1(request: Request) -> Response:
    """The address `kinetic serve` prints, opened in a browser: the chat page."""
    if wants_html(request):
        return Redirect("/", status_code=302)
    raise ApiError(404, "no endpoint /v1: the OpenAI API is under it (/v1/chat/completions, /v1/models, ...)")


ROUTES = [root, static, v1]
