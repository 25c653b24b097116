"""Which web pages may call the server (kinetic/server/security.py): this computer, Ollama's default
app, editor and file origins, and --allowed-origins / KINETIC_ORIGINS / OLLAMA_ORIGINS patterns;
every other site stays refused."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from litestar import Litestar, get
from litestar.middleware import DefineMiddleware
from litestar.testing import TestClient

from kinetic.server.errors import EXCEPTION_HANDLERS
from kinetic.server.options import ServerOptions, add_server_args, server_settings
from kinetic.server.security import Guard, origin_matches, origin_patterns

ALLOWED_BY_DEFAULT = ["http://localhost", "https://localhost:5173", "http://127.0.0.1:3000", "http://0.0.0.0:8000",
                      "http://[::1]:8080", "app://obsidian.md", "file://", "tauri://localhost",
                      "vscode-webview://1cp8q5h0lsla1dt", "vscode-file://vscode-app", "http://127.0.0.1:8080"]
REFUSED_BY_DEFAULT = ["https://evil.example", "http://localhost.evil.example", "null", "chrome-extension://abcdef",
                      "http://10.0.0.2:8080", "ftp://127.0.0.2.evil", "apps://x", "http://[::1"]


@get("/v1/models", sync_to_thread=False)
def models() -> dict:
    return {"object": "list"}


def _client(allowed: tuple[str, ...] = ()) -> TestClient:
    app = Litestar(route_handlers=[models], exception_handlers=EXCEPTION_HANDLERS,
                   middleware=[DefineMiddleware(Guard, options=ServerOptions(allowed_origins=allowed))])
    return TestClient(app, base_url="http://127.0.0.1:8080")


@pytest.mark.parametrize("origin", ALLOWED_BY_DEFAULT)
def test_this_computer_and_app_origins_are_allowed_with_cors(origin):
    """Pages from this computer (any port, 0.0.0.0 too) and Ollama's default app, editor and file
    origins are served, with their Origin echoed in Access-Control-Allow-Origin; preflights answer 204."""
    with _client() as client:
        response = client.get("/v1/models", headers={"Origin": origin})
        assert response.status_code == 200, origin
        assert response.headers["access-control-allow-origin"] == origin
        assert client.options("/v1/models", headers={"Origin": origin}).status_code == 204


@pytest.mark.parametrize("origin", REFUSED_BY_DEFAULT)
def test_other_sites_stay_refused(origin):
    """Any other site, a null origin, browser extensions and malformed origins answer 403 naming the flag."""
    with _client() as client:
        response = client.get("/v1/models", headers={"Origin": origin})
        assert response.status_code == 403, origin
        assert "--allowed-origins" in response.json()["error"]["message"]


def test_allowed_origins_patterns_admit_exactly_what_they_name():
    """An exact origin, a one-wildcard pattern and `*` admit what they match and nothing else."""
    with _client(("https://chat.example.com", "chrome-extension://*", "https://*.corp.example")) as client:
        for origin in ("https://chat.example.com", "chrome-extension://abcdef", "https://wiki.corp.example",
                       "HTTPS://Chat.Example.com"):
            assert client.get("/v1/models", headers={"Origin": origin}).status_code == 200, origin
        for origin in ("https://chat.example.com.evil", "http://chat.example.com", "https://corp.example.evil",
                       "moz-extension://abcdef"):
            assert client.get("/v1/models", headers={"Origin": origin}).status_code == 403, origin
    with _client(("*",)) as client:
        assert client.get("/v1/models", headers={"Origin": "https://anything.example"}).status_code == 200
    assert origin_matches("https://a.b", "https://*") and not origin_matches("http://a.b", "https://*")


def test_flag_and_environment_variables_set_the_patterns():
    """--allowed-origins replaces KINETIC_ORIGINS; OLLAMA_ORIGINS is added either way; a list is
    comma-separated with blanks dropped."""
    env = {"KINETIC_ORIGINS": "https://a.example, https://b.example", "OLLAMA_ORIGINS": "app://*,"}
    assert origin_patterns(None, env) == ("https://a.example", "https://b.example", "app://*")
    assert origin_patterns("https://c.example", env) == ("https://c.example", "app://*")
    assert origin_patterns(None, {}) == ()
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    settings = server_settings(parser.parse_args(["--allowed-origins", "https://x.example"]), env)
    assert settings == {"allowed_origins": ("https://x.example", "app://*"), "sign_key": None}


def test_serve_help_lists_the_flag():
    """`kinetic serve --help` shows --allowed-origins and --sign-key."""
    out = subprocess.run([sys.executable, "-m", "kinetic.cli.main", "serve", "--help"], capture_output=True,
                         text=True, timeout=60).stdout
    assert "--allowed-origins LIST" in out and "--sign-key FILE" in out
