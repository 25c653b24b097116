"""The chat page's routes (kinetic/server/page.py) on a small Litestar app with the server's Guard
and error handlers: what a browser and a program get at / and /v1, the page's security headers,
the files it ships, and the API key left off the page (and only the page)."""

from __future__ import annotations

import fnmatch
from importlib import resources
from pathlib import Path

import pytest
from litestar import Litestar, get
from litestar.middleware import DefineMiddleware
from litestar.testing import TestClient

from kinetic.server import page
from kinetic.server.errors import EXCEPTION_HANDLERS
from kinetic.server.options import ServerOptions
from kinetic.server.security import Guard

BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
ROOT = Path(__file__).resolve().parents[2]


@get("/v1/models", sync_to_thread=False)
def models() -> dict:
    return {"object": "list", "data": []}


def client(api_key: str | None = None) -> TestClient:
    app = Litestar(route_handlers=[*page.ROUTES, models], exception_handlers=EXCEPTION_HANDLERS,
                   middleware=[DefineMiddleware(Guard, options=ServerOptions(api_key=api_key))], openapi_config=None)
    return TestClient(app, base_url="http://127.0.0.1:8080")


def test_root_is_the_page_for_a_browser_and_text_for_a_program():
    """/ answers the chat page's HTML to a browser and Ollama's plain 'is running' line to curl."""
    with client() as c:
        html = c.get("/", headers=BROWSER)
        text = c.get("/")
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    assert '<script src="/static/chat.js"' in html.text
    assert text.status_code == 200 and text.text == "Kinetic is running"


def test_page_sends_a_strict_csp_and_has_no_inline_code():
    """The page's Content-Security-Policy allows scripts and styles from the server only, and the
    HTML holds no inline script, style or event handler it would block."""
    with client() as c:
        response = c.get("/", headers=BROWSER)
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe" not in csp
    assert response.headers["x-content-type-options"] == "nosniff"
    body = response.text.lower()
    assert "<script>" not in body and "<style" not in body and " onclick=" not in body and " style=" not in body


@pytest.mark.parametrize("name,kind", [("chat.js", "text/javascript"), ("chat.css", "text/css")])
def test_static_files_are_served_with_their_types(name, kind):
    """The script and the style sheet come with their content types and the page's headers."""
    with client() as c:
        response = c.get(f"/static/{name}")
    assert response.status_code == 200 and response.headers["content-type"].startswith(kind)
    assert response.content == resources.files("kinetic.server").joinpath("static", name).read_bytes()


def test_unknown_static_file_is_a_404():
    """Only the shipped files are served: another name under /static is a 404, never a file read."""
    with client() as c:
        assert c.get("/static/..%2Fpage.py").status_code in (401, 404)
        assert c.get("/static/index.htm").status_code == 404


def test_v1_redirects_a_browser_and_answers_json_to_a_program():
    """/v1 opened in a browser redirects to /; an API client gets the API's JSON 404."""
    with client() as c:
        browser = c.get("/v1", headers=BROWSER, follow_redirects=False)
        program = c.get("/v1")
    assert browser.status_code == 302 and browser.headers["location"] == "/"
    assert program.status_code == 404 and program.json()["error"]["type"] == "not_found_error"


def test_api_key_mode_leaves_the_page_open_and_the_api_closed():
    """With --api-key the page and its files load without a key (so it can ask for one), while the
    API it calls still answers 401."""
    with client(api_key="sekrit") as c:
        assert c.get("/", headers=BROWSER).status_code == 200
        assert c.get("/static/chat.js").status_code == 200
        assert c.get("/v1/models").status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer sekrit"}).status_code == 200


def test_static_files_are_package_data():
    """pyproject.toml ships every file of kinetic/server/static in the wheel."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib comes with Python 3.11")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["kinetic.server"]
    shipped = [p.name for p in (ROOT / "kinetic/server/static").iterdir()]
    assert {"index.html", "chat.js", "chat.css"} <= set(shipped)
    for name in shipped:
        assert any(fnmatch.fnmatch(f"static/{name}", p) for p in patterns), name
