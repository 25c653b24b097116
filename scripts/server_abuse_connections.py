"""The connection-level groups of scripts/server_abuse.py: clients that hold, trickle, flood or leave.

Each check returns how many cases it sent. The policy they check is kinetic/server/http.py's: 64
connections, 48 from one address, idle and slow ones closed to make room, /health always answered;
and kinetic/server/offload.py's: a 16 MiB body is prepared off the event loop. (A client that stops
reading its answer is checked by tests/server/test_connections.py, with a short deadline.) Only the
standard library is used.
"""

from __future__ import annotations

import json
import threading
import time

from abuse_client import CHAT, Server, status_of

BIG_CHAT = {"messages": [{"role": "user", "content": "hello world " * 1_390_000}], "max_tokens": 1}  # 16.7 MB


def _wait_until_idle(s: Server, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status, slots = s.json("GET", "/slots")
        if status == 200 and not slots[0]["is_processing"]:
            return
        time.sleep(0.1)
    raise AssertionError(f"the engine was still busy {seconds:.0f} s after its clients left")


def disconnects(s: Server) -> int:
    for _ in range(5):  # headers promising a body that never comes
        with s.connect(5) as c:
            c.sendall(s.raw_request("POST", "/v1/chat/completions", b"x" * 100)[:-100])
    with s.connect(5) as c:
        c.sendall(s.raw_request("POST", "/v1/chat/completions", json.dumps(CHAT).encode())[:-10])
    body = json.dumps({**CHAT, "max_tokens": 400, "stream": True}).encode()
    with s.connect() as c:  # leave in the middle of a stream
        c.sendall(s.raw_request("POST", "/v1/chat/completions", body))
        seen = b""
        while b"data:" not in seen and (chunk := c.recv(4096)):
            seen += chunk
        assert b"data:" in seen, f"a streamed chat sent {seen[:200]!r}"
    body = json.dumps({"prompt": "Once upon a time", "n_predict": 400, "ignore_eos": True}).encode()
    with s.connect() as c:  # leave while a whole answer is made
        c.sendall(s.raw_request("POST", "/completion", body))
        time.sleep(0.3)
    _wait_until_idle(s)  # the engine drops both answers at their next token
    return 8


def _read_response(sock) -> bytes:
    """One HTTP/1.1 answer with a Content-Length (the connection stays open); b"" when it was closed."""
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            if not (chunk := sock.recv(4096)):
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length and (chunk := sock.recv(4096)):
            body += chunk
        return head + b"\r\n\r\n" + body
    except OSError:
        return data


def parallel_connections(s: Server) -> int:
    """100 connections from one address, then a kept-alive request on each, then a second request on
    each: every answer is 200, 503 or a closed socket, and at the end at most 48 of them are still
    held (each newcomer past 48 closed an idle one to make room), but not far fewer. Counting the
    connections still held, rather than the first answers, keeps this true however the server's
    accepts and answers interleave (a busy server may answer early connections before it accepts
    later ones: all 100 answered, never more than 48 at once)."""
    socks = [s.connect(10) for _ in range(100)]
    keep = f"GET /v1/models HTTP/1.1\r\nHost: {s.host}:{s.port}\r\n\r\n".encode()
    close = f"GET /v1/models HTTP/1.1\r\nHost: {s.host}:{s.port}\r\nConnection: close\r\n\r\n".encode()
    try:
        statuses = []
        for request in (keep, close):
            for c in socks:
                try:
                    c.sendall(request)
                except OSError:
                    pass  # closed to make room
            statuses.append([status_of(_read_response(c)) for c in socks])
    finally:
        for c in socks:
            c.close()
    seen = set(statuses[0]) | set(statuses[1])
    assert seen <= {0, 200, 503}, f"100 connections got statuses {sorted(seen)}"
    held = statuses[1].count(200)
    assert 32 <= held <= 48, f"{held} of 100 connections from one address were still held (at most 48)"
    return 200


def idle_sockets_then_a_client(s: Server) -> int:
    """64 sockets opened and left idle do not lock out the next client, nor /health."""
    socks = [s.connect() for _ in range(64)]
    try:
        time.sleep(0.2)
        status, _ = s.request("GET", "/v1/models", timeout=10)
        assert status == 200, f"a client after 64 idle sockets got {status}"
        assert s.request("GET", "/health", timeout=10)[0] == 200
    finally:
        for c in socks:
            c.close()
    return 66


def slow_loris(s: Server, short: bool) -> int:
    """70 clients sending their headers a byte at a time do not lock out a client that sends a whole request."""
    stop = threading.Event()
    head = f"GET /v1/models HTTP/1.1\r\nHost: {s.host}:{s.port}\r\nX-Slow: ".encode() + b"a" * 500

    def trickle():
        try:
            with s.connect() as c:
                for byte in head:
                    if stop.is_set():
                        return
                    c.sendall(bytes([byte]))
                    time.sleep(0.2)
        except OSError:
            pass  # closed to make room: what the check wants

    threads = [threading.Thread(target=trickle, daemon=True) for _ in range(70)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0 if short else 5.0)
        started = time.monotonic()
        status, _ = s.request("GET", "/v1/models", timeout=10)
        waited = time.monotonic() - started
        assert status == 200 and waited < 2, f"a client during a slow-loris got {status} after {waited:.1f} s"
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)
    return 71


def body_16_mib(s: Server) -> int:
    """A 16.7 MB chat body is refused (it cannot fit the context) while /health keeps answering
    within 2 s and another client's stream keeps coming."""
    big = json.dumps(BIG_CHAT).encode()
    health, gaps, done = [], [], threading.Event()

    def probe():
        while not done.is_set():
            started = time.monotonic()
            s.request("GET", "/health", timeout=60)
            health.append(time.monotonic() - started)
            time.sleep(0.02)

    def stream():
        body = json.dumps({"prompt": "Once upon a time", "n_predict": 200, "ignore_eos": True, "stream": True})
        with s.connect(60) as c:
            c.sendall(s.raw_request("POST", "/completion", body.encode()))
            last = time.monotonic()
            while not done.is_set() and c.recv(4096):
                gaps.append(time.monotonic() - last)
                last = time.monotonic()

    threads = [threading.Thread(target=probe), threading.Thread(target=stream)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    try:
        status, answer = s.json("POST", "/v1/chat/completions", big, timeout=120)
    finally:
        time.sleep(0.3)
        done.set()
        for t in threads:
            t.join(timeout=60)
    assert status in (200, 400), f"a 16 MiB chat got {status}: {str(answer)[:200]}"
    assert max(health) < 2, f"/health took {max(health):.1f} s during a 16 MiB request"
    assert gaps and max(gaps) < 2, f"another client's stream stalled {max(gaps or [0]):.1f} s"
    _wait_until_idle(s)
    return 1 + len(health) + 1


def stalled_headers(s: Server) -> int:
    with s.connect(40) as c:
        c.sendall(s.raw_request("POST", "/v1/chat/completions", b"", length=50))
        start = time.monotonic()
        try:
            data = c.recv(4096)
        except OSError:
            data = b""
        waited = time.monotonic() - start
    assert waited < 35 and (not data or status_of(data) == 408), f"a stalled client was kept {waited:.0f} s"
    return 1

