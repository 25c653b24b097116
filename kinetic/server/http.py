"""Serving an app over HTTP/1.1 with uvicorn, with the limits a server open to clients needs.

Owns: binding the socket first (so a port in use is a clear error and --port 0 picks a free one),
at most max_connections open connections served (a connection opened beyond them gets a 503 for
its request, in the API's JSON error shape, and is closed), and the request deadline: a client that
has not sent its request line and headers within request_seconds is disconnected (the body's own
deadline is enforced while it is read, in body.py).
"""

from __future__ import annotations

import asyncio
import json
import socket

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from kinetic.errors import KineticError
from kinetic.server.errors import error_body
from kinetic.server.options import ServerOptions

MAX_HEADER_BYTES = 16 * 1024  # a request line and headers larger than this get a 400


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise KineticError(f"cannot listen on {host}:{port}: {e.strerror or e}",
                           "Choose another port with --port, or stop the program using this one.") from None
    sock.listen(256)
    sock.set_inheritable(True)
    return sock


async def _busy(scope, receive, send) -> None:
    """The app a connection beyond the limit gets: 503, then the connection closes."""
    body = json.dumps(error_body(scope.get("path", "/"), 503, "the server has too many open connections; "
                                 "try again shortly")).encode()
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def limited_protocol(seconds: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol, serving the first max_connections connections and closing those
    that take longer than `seconds` to send their request line and headers."""

    class LimitedProtocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                self.app = _busy  # this connection's requests get a 503 (the others are served as usual)
            self._arm()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()  # the headers are in; the body's deadline is the app's

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()  # the next request on this connection gets the same time

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._too_slow)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            self._deadline = None
            if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
                self.transport.close()

    return LimitedProtocol


def serve(app, options: ServerOptions, sock: socket.socket) -> None:
    """Run until interrupted (Ctrl+C stops it, finishing what it can within a few seconds)."""
    protocol = limited_protocol(options.request_seconds, options.max_connections)
    config = uvicorn.Config(app, http=protocol, ws="none", lifespan="on", timeout_keep_alive=5,
                            timeout_graceful_shutdown=3, h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                            log_level="error", access_log=False, server_header=False)
    uvicorn.Server(config).run(sockets=[sock])
