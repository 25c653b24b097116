"""A server in the test process: create_app(model, options) served by uvicorn on a free port, for
tests that drive it with real client packages (openai, httpx) and want the model loaded once; the
fixtures such modules share (`url = url_fixture()`, `client = openai_client_fixture()`)."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from kinetic.server.http import bind, make_server
from kinetic.server.options import ServerOptions


@contextlib.contextmanager
def serving(model, options: ServerOptions | None = None):
    """Yields the server's base URL (http://127.0.0.1:PORT) while it runs."""
    from kinetic.server import create_app

    options = options or ServerOptions()
    sock = bind("127.0.0.1", 0)
    server = make_server(create_app(model, options), options)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def url_fixture():
    """A module-scoped `url` fixture: a test module's line `url = url_fixture()` serves the `model`
    fixture's model (serving) once for the module's tests."""

    @pytest.fixture(scope="module")
    def url(model):
        with serving(model) as base:
            yield base

    return url


def openai_client_fixture():
    """A module-scoped `client` fixture: the openai package's client of the `url` fixture's server
    (no retries, so a failing request fails the test at once)."""

    @pytest.fixture(scope="module")
    def client(url):
        import openai  # a dev extra: only the modules that use the package need it

        return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)

    return client
