"""Abuse a running `kinetic serve` the way broken and hostile clients do, then check it still answers.

    python scripts/server_abuse.py -- kinetic serve model.gguf -c 512 --port 8091
    python scripts/server_abuse.py --url http://127.0.0.1:8091        # a server already running

Sends malformed JSON, wrong types, oversized bodies and headers, chunked bodies, an HTTP/2 preface,
bad input to the llama-server and Ollama routes, a client that sends one byte at a time, clients
that disconnect before the body and in the middle of a stream, 100 parallel connections and 8
parallel chats; after each group the server must still answer /health, and at the end a greedy chat
must give the answer it gave at the start. --short keeps the slow parts small (CI, under ~30 s);
--long adds the client that sends its headers and stalls (disconnected after 30 s).
Exit code 0 when every check passes, 1 otherwise. Only the standard library is used.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

CHAT = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 4,
        "temperature": 0}


class Server:
    def __init__(self, url: str):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port or 80

    def request(self, method: str, path: str, body=None, headers: dict | None = None,
                timeout: float = 60) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            hdrs = {"Content-Type": "application/json", **(headers or {})}
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

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
            return out

    def raw_request(self, method: str, path: str, body: bytes, extra: str = "", length: int | None = None) -> bytes:
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nConnection: close\r\n"
                f"Content-Type: application/json\r\n{extra}")
        if "Transfer-Encoding" not in extra:
            head += f"Content-Length: {len(body) if length is None else length}\r\n"
        return (head + "\r\n").encode() + body


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


# -- the checks ----------------------------------------------------------------------------------------


def malformed_json(s: Server) -> None:
    for body in (b"{", b"{'a': 1}", b"[1, 2", b"\xff\xfe\x00", b"null", b"[]", b"\"text\"", b"",
                 b"[" * 100_000 + b"]" * 100_000, b'{"max_tokens": 1e999}', b'{"temperature": NaN}',
                 b'{"a": ' + b"9" * 5000 + b"}", b'{"a": 1} trailing'):
        for path in ("/v1/chat/completions", "/v1/completions", "/completion", "/tokenize", "/api/chat"):
            expect_error(s, "POST", path, body)


def wrong_types(s: Server) -> None:
    cases = [
        ("/v1/chat/completions", {"messages": "hello"}),
        ("/v1/chat/completions", {"messages": []}),
        ("/v1/chat/completions", {"messages": [{"role": "user"}], "max_tokens": "4"}),
        ("/v1/chat/completions", {**CHAT, "max_tokens": 0}),
        ("/v1/chat/completions", {**CHAT, "temperature": "hot"}),
        ("/v1/chat/completions", {**CHAT, "temperature": -1}),
        ("/v1/chat/completions", {**CHAT, "top_p": 2}),
        ("/v1/chat/completions", {**CHAT, "n": 2}),
        ("/v1/chat/completions", {**CHAT, "stop": 5}),
        ("/v1/chat/completions", {**CHAT, "logit_bias": {"x": 1}}),
        ("/v1/chat/completions", {**CHAT, "top_logprobs": 21, "logprobs": True}),
        ("/v1/chat/completions", {**CHAT, "seed": "abc"}),
        ("/v1/chat/completions", {**CHAT, "stream": "yes"}),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": "video"}]}]}),
        ("/v1/chat/completions", {**CHAT, "chat_template_kwargs": [1]}),
        ("/v1/completions", {"prompt": {"a": 1}}),
        ("/v1/completions", {"prompt": "x" * 100, "max_tokens": -5}),
        ("/v1/completions", {"prompt": [1, "a", None]}),
        ("/v1/completions", {"prompt": "hi " * 70_000, "max_tokens": 1}),  # longer than any context
    ]
    for path, body in cases:
        expect_error(s, "POST", path, body)


def bad_llama_and_ollama_input(s: Server) -> None:
    cases = [
        ("/completion", {"prompt": [[1, 2], [3]]}),
        ("/completion", {"prompt": [1, 2, 99_999_999]}),
        ("/completion", {"prompt": "hi", "n_predict": "many"}),
        ("/completion", {"prompt": "hi", "grammar": "root ::= nope"}),
        ("/completion", {"prompt": "hi", "samplers": ["nonsense"]}),
        ("/completion", {"prompt": "hi", "logit_bias": [[1]]}),
        ("/tokenize", {"content": 5}),
        ("/detokenize", {"tokens": ["a"]}),
        ("/detokenize", {"tokens": [-1]}),
        ("/api/chat", {"messages": "x"}),
        ("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "options": {"temperature": "x"}}),
        ("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "options": 3}),
        ("/api/generate", {"prompt": "hi", "template": "{{ .Prompt }}"}),
        ("/api/generate", {"prompt": "hi", "context": [1, 2, 3]}),
        ("/api/generate", {"prompt": "hi", "suffix": "end"}),
        ("/api/generate", {"prompt": 5}),
        ("/api/embed", {"input": "hi"}),
        ("/api/embeddings", {"prompt": "hi"}),
    ]
    for path, body in cases:
        expect_error(s, "POST", path, body)
    expect_error(s, "GET", "/no/such/route", None, status=404)
    expect_error(s, "DELETE", "/v1/models", None, status=405)
    expect_error(s, "POST", "/v1/chat/completions", json.dumps(CHAT).encode(), status=415,
                 headers={"Content-Type": "text/plain"})


def oversized(s: Server) -> None:
    declared = s.raw(s.raw_request("POST", "/tokenize", b"{}", length=99_999_999_999))
    assert status_of(declared) == 413, f"a huge Content-Length got {declared[:80]!r}"
    big = b'{"content": "' + b"a" * (17 * 1024 * 1024) + b'"}'
    sent = s.raw(s.raw_request("POST", "/tokenize", big), timeout=30)
    assert status_of(sent) in (0, 413), f"a 17 MiB body got {sent[:80]!r}"
    headers = s.raw(s.raw_request("GET", "/health", b"", "X-Big: " + "b" * 70_000 + "\r\n"))
    assert status_of(headers) in (0, 400, 431), f"70 kB of headers got {headers[:80]!r}"
    many = "".join(f"X-H{i}: v\r\n" for i in range(5000))
    headers = s.raw(s.raw_request("GET", "/health", b"", many))
    assert status_of(headers) in (0, 400, 431), f"5000 headers got {headers[:80]!r}"


def chunked_body(s: Server) -> None:
    body = json.dumps({"content": "Hello world"}).encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 5]), body[i:i + 5]) for i in range(0, len(body), 5))
    reply = s.raw(s.raw_request("POST", "/tokenize", chunks + b"0\r\n\r\n", "Transfer-Encoding: chunked\r\n"))
    assert status_of(reply) == 200 and b'"tokens"' in reply, f"a chunked body got {reply[:200]!r}"
    bad = s.raw(s.raw_request("POST", "/tokenize", b"zz\r\nbroken", "Transfer-Encoding: chunked\r\n"))
    assert status_of(bad) in (0, 400), f"a broken chunked body got {bad[:80]!r}"


def http2_preface(s: Server) -> None:
    reply = s.raw(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x12\x04\x00\x00\x00\x00\x00" + b"\x00" * 18)
    assert status_of(reply) in (0, 400, 404, 505), f"an HTTP/2 preface got {reply[:80]!r}"
    reply = s.raw(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64)  # a TLS hello
    assert status_of(reply) in (0, 400), f"a TLS hello got {reply[:80]!r}"


def one_byte_at_a_time(s: Server, short: bool) -> None:
    body = json.dumps({"content": "one byte at a time"}).encode()
    request = s.raw_request("POST", "/tokenize", body)
    reply = s.raw(request, timeout=60, pace=0.002 if short else 0.02)
    assert status_of(reply) == 200 and b'"tokens"' in reply, f"a byte-by-byte request got {reply[:200]!r}"


def disconnects(s: Server) -> None:
    for _ in range(5):  # headers promising a body that never comes
        with socket.create_connection((s.host, s.port), timeout=5) as c:
            c.sendall(s.raw_request("POST", "/v1/chat/completions", b"x" * 100)[:-100])
    with socket.create_connection((s.host, s.port), timeout=5) as c:
        c.sendall(s.raw_request("POST", "/v1/chat/completions", json.dumps(CHAT).encode())[:-10])
    body = json.dumps({**CHAT, "max_tokens": 400, "stream": True}).encode()
    with socket.create_connection((s.host, s.port), timeout=30) as c:  # leave in the middle of a stream
        c.sendall(s.raw_request("POST", "/v1/chat/completions", body))
        seen = b""
        while b"data:" not in seen and (chunk := c.recv(4096)):
            seen += chunk
        assert b"data:" in seen, f"a streamed chat sent {seen[:200]!r}"
    body = json.dumps({"prompt": "Once upon a time", "n_predict": 400, "ignore_eos": True}).encode()
    with socket.create_connection((s.host, s.port), timeout=30) as c:  # leave while a whole answer is made
        c.sendall(s.raw_request("POST", "/completion", body))
        time.sleep(0.3)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the engine drops both answers at their next token
        status, slots = s.json("GET", "/slots")
        if status == 200 and not slots[0]["is_processing"]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the engine was still busy 20 s after its clients left")


def parallel_connections(s: Server) -> None:
    socks = []
    try:
        for _ in range(100):
            socks.append(socket.create_connection((s.host, s.port), timeout=30))
        request = f"GET /health HTTP/1.1\r\nHost: {s.host}:{s.port}\r\nConnection: close\r\n\r\n".encode()
        for c in socks:
            c.sendall(request)
        statuses = []
        for c in socks:
            data = b""
            try:
                while chunk := c.recv(4096):
                    data += chunk
            except OSError:
                pass
            statuses.append(status_of(data))
    finally:
        for c in socks:
            c.close()
    assert set(statuses) <= {0, 200, 503}, f"100 connections got statuses {sorted(set(statuses))}"
    assert statuses.count(200) >= 50, f"only {statuses.count(200)} of 100 connections were served"
    assert 503 in statuses or 0 in statuses, "100 connections at once were all served, beyond the limit of 64"


def parallel_chats(s: Server) -> None:
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: s.json("POST", "/v1/chat/completions", CHAT, timeout=120), range(8)))
    answers = {json.dumps(body["choices"][0]["message"]) for status, body in results if status == 200}
    assert all(status == 200 for status, _ in results), f"parallel chats got {[st for st, _ in results]}"
    assert len(answers) == 1, f"8 identical greedy chats gave {len(answers)} different answers"


def stalled_headers(s: Server) -> None:
    with socket.create_connection((s.host, s.port), timeout=40) as c:
        c.sendall(s.raw_request("POST", "/v1/chat/completions", b"", length=50))
        start = time.monotonic()
        try:
            data = c.recv(4096)
        except OSError:
            data = b""
        waited = time.monotonic() - start
    assert waited < 35 and (not data or status_of(data) == 408), f"a stalled client was kept {waited:.0f} s"


def greedy_answer(s: Server) -> str:
    status, body = s.json("POST", "/v1/chat/completions", CHAT, timeout=120)
    assert status == 200, f"the reference chat got {status}: {body}"
    return body["choices"][0]["message"]["content"]


# -- running -------------------------------------------------------------------------------------------


def start(command: list[str], timeout: float = 120) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    found: list[str] = []

    def read():
        for line in proc.stdout:
            match = re.search(r"at (http://\S+?)/v1", line)
            if match and not found:
                found.append(match.group(1))

    threading.Thread(target=read, daemon=True).start()
    end = time.monotonic() + timeout
    while not found and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.05)
    if not found:
        proc.kill()
        raise SystemExit(f"server_abuse: the server did not print its address (exit code {proc.poll()})")
    return proc, found[0]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="a running server (instead of a command after --)")
    p.add_argument("--short", action="store_true", help="keep the slow checks small (CI)")
    p.add_argument("--long", action="store_true", help="also check that a stalled client is dropped (35 s)")
    args = p.parse_args(own)
    if bool(args.url) == bool(command):
        p.error("give either --url URL or a server command after --")
    proc, url = start(command) if command else (None, args.url)
    server = Server(url)
    checks: list[tuple[str, Callable[[], None]]] = [
        ("malformed JSON", lambda: malformed_json(server)),
        ("wrong types", lambda: wrong_types(server)),
        ("bad llama-server and Ollama input", lambda: bad_llama_and_ollama_input(server)),
        ("oversized bodies and headers", lambda: oversized(server)),
        ("chunked bodies", lambda: chunked_body(server)),
        ("HTTP/2 preface and TLS hello", lambda: http2_preface(server)),
        ("one byte at a time", lambda: one_byte_at_a_time(server, args.short)),
        ("disconnects before the body and mid-stream", lambda: disconnects(server)),
        ("100 parallel connections", lambda: parallel_connections(server)),
        ("8 parallel chats", lambda: parallel_chats(server)),
    ]
    if args.long:
        checks.append(("a client that stalls after its headers", lambda: stalled_headers(server)))
    failures = 0
    try:
        before = greedy_answer(server)
        for name, check in checks:
            start_time = time.monotonic()
            try:
                check()
                still_alive(server)
                print(f"ok    {name} ({time.monotonic() - start_time:.1f} s)", flush=True)
            except (AssertionError, OSError, ValueError) as e:
                failures += 1
                print(f"FAIL  {name}: {e}", flush=True)
        after = greedy_answer(server)
        if after != before:
            failures += 1
            print(f"FAIL  the greedy answer changed: {before!r} -> {after!r}")
        else:
            print("ok    the server still answers, as before")
    finally:
        if proc is not None:
            alive = proc.poll() is None
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            if not alive:
                failures += 1
                print("FAIL  the server process died")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
