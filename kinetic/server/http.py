"""Serving an app over HTTP/1.1 with uvicorn, with the connection policy a server open to clients needs.

Owns: binding the socket first (so a port in use is a clear error and --port 0 picks a free one),
and which connections are served, so that no one client can lock the others out:

* At most max_connections are served, at most max_client_connections of them from one address.
* A connection that would pass either limit first makes room: a connection that is not being
  served (idle between requests, or never sent one, or still sending its request SLOW_S after
  starting it) is closed, taken from the address holding the most connections, longest waiting
  first. Only when none can make room is the newcomer refused: its request gets a 503 in the API's
  error shape (a request for /health gets its 200: /health always answers) and it is closed.
* Deadlines: the request line and headers within request_seconds of connecting or of the previous
  answer; the body within request_seconds (body.py); a client that stops reading its answer for
  request_seconds is disconnected, which cancels its job.

A refused connection counts for neither limit; at most max_connections of them are kept open at
once (to answer them), more are closed unanswered.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import Counter

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from kinetic.errors import KineticError
from kinetic.server.errors import error_body
from kinetic.server.options import ServerOptions

MAX_HEADER_BYTES = 16 * 1024  # a request line and headers larger than this get a 400
SLOW_S = 2.0  # a request still arriving this long after it started may be closed to make room
REFUSED_S = 5.0  # a refused connection has this long to send the request its 503 answers
HEALTH_PATHS = frozenset({"/health", "/v1/health"})


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


async def _refused(scope, receive, send) -> None:
    """The app a refused connection gets: /health answers as usual, anything else 503; then it closes."""
    path = scope.get("path", "/")
    if path in HEALTH_PATHS:
        status, payload = 200, {"status": "ok"}
    else:
        status, payload = 503, error_body(path, 503, "the server has too many open connections; try again shortly")
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def limited_protocol(options: ServerOptions) -> type[H11Protocol]:
    """uvicorn's h11 protocol under the policy above."""
    seconds, most, most_per_client = options.request_seconds, options.max_connections, options.max_client_connections

    class LimitedProtocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _write_deadline: asyncio.TimerHandle | None = None
        counted = False  # served: counts for the limits (False once refused or closed to make room)
        waiting_since = 0.0  # loop time it connected or last answered; a request's start while one arrives
        _cycle_seen = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.waiting_since = self.loop.time()
            self.counted = True
            if not self._make_room():
                self._refuse()
            self._arm(REFUSED_S if self.app is _refused else seconds)

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and self.cycle is not self._cycle_seen:
                self._cycle_seen, self.waiting_since = self.cycle, self.loop.time()
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()  # the headers are in; the body's deadline is the app's

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self.waiting_since = self.loop.time()
            self._arm(seconds)  # the next request on this connection gets the same time

        def connection_lost(self, exc) -> None:
            self.counted = False
            self._disarm()
            self._cancel_write_deadline()
            super().connection_lost(exc)

        def pause_writing(self) -> None:
            super().pause_writing()
            self._cancel_write_deadline()
            self._write_deadline = self.loop.call_later(seconds, self._stopped_reading)

        def resume_writing(self) -> None:
            super().resume_writing()
            self._cancel_write_deadline()

        # -- the policy ----------------------------------------------------------------------------

        def _host(self) -> str:
            return self.client[0] if self.client else ""

        def _making_room_possible(self, now: float) -> bool:
            """Not being served: idle, or still sending a request that started SLOW_S ago."""
            if not self.counted or self.transport.is_closing():
                return False
            if self.cycle is None or self.cycle.response_complete:
                return True
            return self.cycle.more_body and now - self.waiting_since >= SLOW_S

        def _make_room(self) -> bool:
            """True when this connection may be served (after closing another, if it had to)."""
            served = [c for c in self.connections if getattr(c, "counted", False)]
            mine = [c for c in served if c._host() == self._host()]
            if len(mine) <= most_per_client and len(served) <= most:
                return True
            pool = mine if len(mine) > most_per_client else served
            now = self.loop.time()
            held = Counter(c._host() for c in served)
            candidates = [c for c in pool if c is not self and c._making_room_possible(now)]
            if not candidates:
                return False
            victim = max(candidates, key=lambda c: (held[c._host()], now - c.waiting_since))
            victim.counted = False
            victim.transport.close()
            return True

        def _refuse(self) -> None:
            self.counted = False
            refused = sum(1 for c in self.connections if c.app is _refused)
            if refused >= most:
                self.transport.close()
            self.app = _refused

        # -- deadlines -----------------------------------------------------------------------------

        def _arm(self, after: float) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(after, self._too_slow)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            self._deadline = None
            if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
                self.transport.close()

        def _cancel_write_deadline(self) -> None:
            if self._write_deadline is not None:
                self._write_deadline.cancel()
                self._write_deadline = None

        def _stopped_reading(self) -> None:
            self._write_deadline = None
            if not self.transport.is_closing():
                self.transport.abort()  # the answer's task sees a disconnect; a job is cancelled

    return LimitedProtocol


def make_server(app, options: ServerOptions) -> uvicorn.Server:
    config = uvicorn.Config(app, http=limited_protocol(options), ws="none", lifespan="on", timeout_keep_alive=5,
                            timeout_graceful_shutdown=3, h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                            log_level="error", access_log=False, server_header=False)
    return uvicorn.Server(config)


def serve(app, options: ServerOptions, sock: socket.socket) -> None:
    """Run until interrupted (Ctrl+C stops it, finishing what it can within a few seconds)."""
    make_server(app, options).run(sockets=[sock])
