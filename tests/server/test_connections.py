"""The connection policy (kinetic/server/http.py) on a real uvicorn server with a small fake app:
idle and slow connections make room, one address cannot take every connection, /health always
answers, a client that stops reading its answer is disconnected. Small limits keep it fast."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time

import pytest

from kinetic.server.http import bind, make_server
from kinetic.server.options import ServerOptions

OTHER_ADDRESS = "127.0.0.2"  # a second client address on the loopback network


class FakeApp:
    """ASGI: /slow answers after `hold` seconds, /stream sends forever until its client is gone
    (recording that), anything else answers {"ok": true} at once."""

    def __init__(self, hold: float = 3.0):
        self.hold = hold
        self.stream_gone = threading.Event()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            return await send({"type": "lifespan.shutdown.complete"})
        if scope["path"] == "/slow":
            await asyncio.sleep(self.hold)
        if scope["path"] == "/stream":
            return await self._stream(receive, send)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})

    async def _stream(self, receive, send):
        watcher = asyncio.ensure_future(self._watch(receive))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        chunk = b"x" * 65536
        while not self.stream_gone.is_set():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await asyncio.sleep(0)
        watcher.cancel()

    async def _watch(self, receive):
        while (await receive())["type"] != "http.disconnect":
            pass
        self.stream_gone.set()


@pytest.fixture
def serve():
    """serve(app, **options) -> port of a uvicorn server with LimitedProtocol, stopped after the test."""
    servers = []

    def start(app, **options) -> int:
        sock = bind("127.0.0.1", 0)
        server = make_server(app, ServerOptions(**options))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        servers.append((server, thread))
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        return sock.getsockname()[1]

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=10)


def get(port: int, path: str, source: str | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0) if source else None)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def open_sockets(port: int, n: int, first_bytes: bytes = b"") -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if first_bytes:
            s.sendall(first_bytes)
        socks.append(s)
    time.sleep(0.2)  # the server has seen them all
    return socks


def test_idle_connections_make_room_for_a_new_client(serve):
    """Every connection held idle by one client does not lock the next client out: an idle one is closed for it."""
    port = serve(FakeApp(), max_connections=8, max_client_connections=8)
    socks = open_sockets(port, 8)
    try:
        assert get(port, "/v1/models") == 200
        assert get(port, "/v1/models", OTHER_ADDRESS) == 200
    finally:
        for s in socks:
            s.close()


def test_slow_headers_make_room_for_a_new_client(serve):
    """Connections still trickling their headers (slow-loris) are closed for a client that sends a whole request."""
    port = serve(FakeApp(), max_connections=8, max_client_connections=8)
    socks = open_sockets(port, 12, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    try:
        assert get(port, "/v1/models") == 200
    finally:
        for s in socks:
            s.close()


def test_one_address_cannot_take_every_connection_and_health_always_answers(serve):
    """With one address at its cap of busy connections, it gets 503 for more, /health still gets 200,
    and another address is served."""
    port = serve(FakeApp(hold=3.0), max_connections=8, max_client_connections=4)
    request = b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
    socks = open_sockets(port, 4, request)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/v1/models")
        refused = conn.getresponse()
        assert refused.status == 503 and "error" in json.loads(refused.read())
        assert get(port, "/health") == 200
        assert get(port, "/v1/models", OTHER_ADDRESS) == 200
    finally:
        for s in socks:
            s.close()


def test_a_client_that_stops_reading_is_disconnected(serve):
    """A client that stops reading a streamed answer is disconnected after request_seconds, so the
    app sees it leave (a generation job is then cancelled) instead of waiting on it forever."""
    app = FakeApp()
    port = serve(app, request_seconds=1.0)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        assert app.stream_gone.wait(timeout=15), "the stalled reader was never disconnected"
