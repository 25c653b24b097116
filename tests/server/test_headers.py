"""Hostile header values never turn into a 500: the Guard middleware (kinetic/server/security.py) and
body reading (kinetic/server/body.py) on a small Litestar app with the server's error handlers."""

from __future__ import annotations

import pytest
from litestar import Litestar, Request, get, post
from litestar.middleware import DefineMiddleware
from litestar.testing import TestClient

from kinetic.server.body import parse_json, read_body
from kinetic.server.errors import EXCEPTION_HANDLERS
from kinetic.server.options import ServerOptions
from kinetic.server.security import Guard

HOSTILE = {
    "Origin": ["http://[::1", "http://[", "http://a:99999", "\xff\xfe", "null", "http://localhost:abc", "", "//",
               "file://", "http://%41", "http://[::1]:8080", "http://user@[bad"],
    "Host": ["[::1", "[", "a:99999", "\xff", "", "localhost:abc", "[::1]:x"],
    "Authorization": ["Bearer \xff\xfe", "Bearer", "\x01", "Basic !!!", "bearer " + "k" * 5000],
    "X-Api-Key": ["\xff\xfe\xfd", ""],
    "Content-Type": ["application/json; charset=\xff", ";;;", "multipart/form-data; boundary=", "\xff",
                     "application/x-www-form-urlencoded"],
    "Content-Length": ["\xb2", "\xb9", "1\xa0", "-1", "99999999999999999999999"],
    "Accept": ["\xff", "*/*;q=abc"],
    "Cookie": ["a=\xff; b", "====", ";;"],
}


@get("/v1/models", sync_to_thread=False)
def models() -> dict:
    return {"object": "list"}


@post("/v1/chat/completions", status_code=200)
async def chat(request: Request) -> dict:
    return parse_json(await read_body(request, 1024, 5.0, json_only=True))


@pytest.fixture(scope="module", params=[None, "sekrit"], ids=["open", "api-key"])
def client(request):
    app = Litestar(route_handlers=[models, chat], exception_handlers=EXCEPTION_HANDLERS,
                   middleware=[DefineMiddleware(Guard, options=ServerOptions(api_key=request.param))])
    with TestClient(app, base_url="http://127.0.0.1:8080") as c:
        yield c


@pytest.mark.parametrize("name,value", [(n, v) for n, values in HOSTILE.items() for v in values])
def test_hostile_header_values_are_refused_or_served_never_500(client, name, value):
    """A malformed header value (an Origin that is not a URL, undecodable bytes, odd digits) answers
    a 4xx or a normal 200, never a 500, on GET and POST routes."""
    headers = {name: value.encode("latin-1")}
    for method, path, body in (("GET", "/v1/models", None), ("POST", "/v1/chat/completions", b'{"a": 1}')):
        if name == "Content-Length" and body is None:
            continue
        response = client.request(method, path, headers=headers, content=body)
        assert response.status_code < 500, (name, value, response.status_code, response.text)
        if response.status_code >= 400:
            assert "error" in response.json()


def test_malformed_origin_is_refused_like_a_foreign_page(client):
    """`Origin: http://[::1` (not a URL) gets the 403 a page from another site gets."""
    response = client.get("/v1/models", headers={"Origin": "http://[::1"})
    assert response.status_code == 403 and response.json()["error"]["type"] == "permission_error"
