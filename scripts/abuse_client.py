"""The HTTP client scripts/server_abuse.py and scripts/server_abuse_connections.py talk to the server with.

Every answer that passes through it is checked: a 500, or a body saying "internal error", fails
the check that got it, whatever that check expected. Only the standard library is used.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
from urllib.parse import urlsplit

CHAT = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 4,
        "temperature": 0}


def no_internal_error(what: str, status: int, body: bytes) -> None:
    assert status != 500 and b"internal error" not in body, f"{what}: internal error ({status}): {body[:300]!r}"


class Server:
    def __init__(self, url: str):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port or 80

    def request(self, method: str, path: str, body=None, headers: dict | None = None,
                timeout: float = 60, source: str | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout,
                                          source_address=(source, 0) if source else None)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            hdrs = {"Content-Type": "application/json", **(headers or {})}
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            status, raw = resp.status, resp.read()
        finally:
            conn.close()
        no_internal_error(f"{method} {path}", status, raw)
        return status, raw

    def json(self, method: str, path: str, body=None, **kw) -> tuple[int, dict]:
        status, raw = self.request(method, path, body, **kw)
        try:
            return status, json.loads(raw)
        except ValueError:
            raise AssertionError(f"{method} {path}: status {status} with a body that is not JSON: {raw[:200]!r}") \
                from None

    def raw(self, data: bytes, timeout: float = 10, pace: float = 0.0) -> bytes:
        """Send bytes on a fresh connection (one at a time when pace > 0); read until the server closes."""
        with socket.create_connection((self.host, self.port), timeout=timeout) as s:
            try:
                if pace:
                    for i in range(len(data)):
                        s.sendall(data[i:i + 1])
                        time.sleep(pace)
                else:
                    s.sendall(data)
            except OSError:
                pass  # the server may close early (an oversized request): what it sent is still readable
            out = b""
            try:
                while chunk := s.recv(65536):
                    out += chunk
            except (TimeoutError, OSError):
                pass
        no_internal_error(f"raw {data[:40]!r}", status_of(out), out)
        return out

    def raw_request(self, method: str, path: str, body: bytes, extra: str = "", length: int | None = None) -> bytes:
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nConnection: close\r\n"
                f"Content-Type: application/json\r\n{extra}")
        if "Transfer-Encoding" not in extra:
            head += f"Content-Length: {len(body) if length is None else length}\r\n"
        return (head + "\r\n").encode() + body

    def connect(self, timeout: float = 30) -> socket.socket:
        return socket.create_connection((self.host, self.port), timeout=timeout)


def status_of(response: bytes) -> int:
    match = re.match(rb"HTTP/1\.[01] (\d{3})", response)
    return int(match.group(1)) if match else 0


def expect_error(server: Server, method: str, path: str, body, status: int = 400, **kw) -> None:
    got, data = server.json(method, path, body, **kw)
    assert got == status, f"{method} {path} {str(body)[:80]}: expected {status}, got {got}: {data}"
    assert "error" in data, f"{method} {path}: an error without an error field: {data}"


def still_alive(server: Server) -> None:
    status, data = server.json("GET", "/health", timeout=30)
    assert status == 200 and data == {"status": "ok"}, f"/health answered {status} {data}"
