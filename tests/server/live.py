"""A server in the test process: create_app(model, options) served by uvicorn on a free port, for
tests that drive it with real client packages (openai, httpx) and want the model loaded once."""

from __future__ import annotations

import contextlib
import threading
import time

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
