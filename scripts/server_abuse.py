"""Abuse a running `kinetic serve` the way broken and hostile clients do, then check it still answers.

    python scripts/server_abuse.py -- kinetic serve model.gguf -c 512 --port 8091
    python scripts/server_abuse.py --url http://127.0.0.1:8091        # a server already running

Sends malformed and deeply nested JSON, numbers no field can hold, wrong types, hostile header
values, oversized bodies and headers, chunked bodies, an HTTP/2 preface, bad input to the
llama-server and Ollama routes, a client that sends one byte at a time, clients that disconnect
before the body and in the middle of a stream, a 16 MiB body while /health and another stream are
timed, 64 idle sockets then a client, a slow-loris of 70 connections, 100 parallel connections and 8
parallel chats (the last groups are in server_abuse_connections.py). After each group the server
must still answer /health; at the end a greedy chat must give the answer it gave at the start. Any
500 or "internal error" in any answer fails its group (abuse_client.py). --short keeps the slow
parts small (CI, under ~60 s); --long adds the client that sends its headers and stalls
(disconnected after 30 s). Exit code 0 when every check passes, 1 otherwise. Only the standard
library is used.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from abuse_client import CHAT, Server, expect_error, no_internal_error, status_of, still_alive
from server_abuse_connections import (
    body_16_mib,
    disconnects,
    idle_sockets_then_a_client,
    parallel_connections,
    slow_loris,
    stalled_headers,
)

# -- the checks (each returns how many cases it sent) ---------------------------------------------------


MALFORMED = (b"{", b"{'a': 1}", b"[1, 2", b"\xff\xfe\x00", b"null", b"[]", b"\"text\"", b"",
             b"[" * 100_000 + b"]" * 100_000, b'{"a": ' * 100_000 + b"1" + b"}" * 100_000,
             b'{"max_tokens": 1e999}', b'{"max_tokens": -1e999}', b'{"temperature": NaN}', b'{"top_p": Infinity}',
             b'{"a": ' + b"9" * 5000 + b"}", b'{"a": 1} trailing', b'{"a": "\\ud800"', b"\x00" * 100)
JSON_ROUTES = ("/v1/chat/completions", "/v1/completions", "/completion", "/tokenize", "/detokenize", "/api/chat",
               "/api/generate", "/api/show")


def malformed_json(s: Server) -> int:
    for body in MALFORMED:
        for path in JSON_ROUTES:
            expect_error(s, "POST", path, body)
    return len(MALFORMED) * len(JSON_ROUTES)


def _deep(depth: int, leaf=1):
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


def deep_json_and_huge_numbers(s: Server) -> int:
    """Deep values inside valid JSON, where the server reads them, and numbers no field can hold:
    refused with a 400 or served, never a 500."""
    deep = _deep(900)
    cases = [
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [deep]}]}),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "hi", "tool_calls": [deep]}]}),
        ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f",
                                                                                       "parameters": deep}}]}),
        ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema",
                                                              "json_schema": {"schema": deep}}}),
        ("/v1/chat/completions", {**CHAT, "chat_template_kwargs": {"x": deep}}),
        ("/v1/chat/completions", {**CHAT, "metadata": deep}),
        ("/completion", {"prompt": "hi", "n_predict": 1, "json_schema": deep}),
        ("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "format": deep, "stream": False}),
        ("/v1/chat/completions", {**CHAT, "max_tokens": 10**30}),
        ("/v1/chat/completions", {**CHAT, "seed": 2**64}),
        ("/v1/chat/completions", {**CHAT, "seed": -(10**30)}),
        ("/v1/chat/completions", {**CHAT, "temperature": 1e308}),
        ("/v1/chat/completions", {**CHAT, "top_logprobs": 10**20, "logprobs": True}),
        ("/v1/chat/completions", {**CHAT, "logit_bias": {str(10**30): 1}}),
        ("/v1/chat/completions", {**CHAT, "logit_bias": {"1": 1e308}}),
        ("/v1/chat/completions", {**CHAT, "logit_bias": {str(i): 1 for i in range(50_000)}}),
        ("/completion", {"prompt": [10**30], "n_predict": 1}),
        ("/completion", {"prompt": "hi", "n_predict": -(10**30)}),
        ("/completion", {"prompt": "hi", "n_predict": 1, "n_probs": 10**9}),
        ("/completion", {"prompt": "hi", "n_predict": 1, "top_k": 10**30}),
        ("/completion", {"prompt": "hi", "n_predict": 1, "repeat_last_n": -(10**12)}),
        ("/detokenize", {"tokens": [10**30]}),
        ("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 10**30},
                       "stream": False}),
        ("/api/generate", {"prompt": "hi", "options": {"num_ctx": 10**30, "num_predict": 1}, "stream": False}),
    ]
    for path, body in cases:
        status, data = s.json("POST", path, body, timeout=120)
        assert status in (200, 400), f"POST {path} {json.dumps(body)[:80]}: got {status}: {str(data)[:200]}"
    return len(cases)


HEADER_NAMES = ("Origin", "Host", "Authorization", "X-Api-Key", "Content-Type", "Content-Length", "Accept",
                "Accept-Encoding", "Cookie", "Transfer-Encoding", "Expect", "Connection", "Upgrade", "Range",
                "If-None-Match", "Forwarded", "X-Forwarded-For", "User-Agent")
HEADER_VALUES = (b"http://[::1", b"http://[", b"[::1", b"a:99999", b"localhost:abc", b"\xff\xfe", b"", b"null",
                 b"\xb2", b"-1", b"1e3", b"5,5", b"99999999999999999999999999", b"Bearer", b"Bearer \xff",
                 b"*/*;q=abc", b"chunked, chunked", b"gzip", b"100-continue", b"upgrade", b"websocket", b"h2c",
                 b"bytes=abc", b"a=\xff; b", b";;;", b"x" * 4000)


def hostile_headers(s: Server) -> int:
    """Every header a client can send, with values that do not parse, on a plain route, /health, a
    request that is refused (the error path) and one that is served: no 500, no internal error."""
    count = 0
    requests = (("GET", "/v1/models", b""), ("GET", "/health", b""),
                ("POST", "/v1/chat/completions", b'{"messages": 1}'), ("POST", "/tokenize", b'{"content": "hi"}'))
    for name in HEADER_NAMES:
        for value in HEADER_VALUES:
            for method, path, data in requests:
                head = f"{method} {path} HTTP/1.1\r\nConnection: close\r\n".encode()
                if name != "Host":
                    head += f"Host: {s.host}:{s.port}\r\n".encode()
                if name != "Content-Type":
                    head += b"Content-Type: application/json\r\n"
                if name not in ("Content-Length", "Transfer-Encoding"):
                    head += b"Content-Length: %d\r\n" % len(data)
                s.raw(head + name.encode() + b": " + value + b"\r\n\r\n" + data, timeout=30)
                count += 1  # s.raw fails the check on a 500 or an internal error
    return count


def wrong_types(s: Server) -> int:
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
    return len(cases)


def bad_llama_and_ollama_input(s: Server) -> int:
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
    return len(cases) + 3


def oversized(s: Server) -> int:
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
    return 4


def chunked_body(s: Server) -> int:
    body = json.dumps({"content": "Hello world"}).encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 5]), body[i:i + 5]) for i in range(0, len(body), 5))
    reply = s.raw(s.raw_request("POST", "/tokenize", chunks + b"0\r\n\r\n", "Transfer-Encoding: chunked\r\n"))
    assert status_of(reply) == 200 and b'"tokens"' in reply, f"a chunked body got {reply[:200]!r}"
    bad = s.raw(s.raw_request("POST", "/tokenize", b"zz\r\nbroken", "Transfer-Encoding: chunked\r\n"))
    assert status_of(bad) in (0, 400), f"a broken chunked body got {bad[:80]!r}"
    return 2


def http2_preface(s: Server) -> int:
    reply = s.raw(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x12\x04\x00\x00\x00\x00\x00" + b"\x00" * 18)
    assert status_of(reply) in (0, 400, 404, 505), f"an HTTP/2 preface got {reply[:80]!r}"
    reply = s.raw(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64)  # a TLS hello
    assert status_of(reply) in (0, 400), f"a TLS hello got {reply[:80]!r}"
    return 2


def one_byte_at_a_time(s: Server, short: bool) -> int:
    body = json.dumps({"content": "one byte at a time"}).encode()
    request = s.raw_request("POST", "/tokenize", body)
    reply = s.raw(request, timeout=60, pace=0.002 if short else 0.02)
    assert status_of(reply) == 200 and b'"tokens"' in reply, f"a byte-by-byte request got {reply[:200]!r}"
    return 1


def parallel_chats(s: Server) -> int:
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: s.json("POST", "/v1/chat/completions", CHAT, timeout=120), range(8)))
    answers = {json.dumps(body["choices"][0]["message"]) for status, body in results if status == 200}
    assert all(status == 200 for status, _ in results), f"parallel chats got {[st for st, _ in results]}"
    assert len(answers) == 1, f"8 identical greedy chats gave {len(answers)} different answers"
    return 8


def greedy_answer(s: Server) -> str:
    status, body = s.json("POST", "/v1/chat/completions", CHAT, timeout=120)
    assert status == 200, f"the reference chat got {status}: {body}"
    return body["choices"][0]["message"]["content"]


# -- running -------------------------------------------------------------------------------------------


def start(command: list[str], log: list[str], timeout: float = 120) -> tuple[subprocess.Popen, str]:
    """Start the server; its stderr lines collect in `log`."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    found: list[str] = []

    def read():
        for line in proc.stdout:
            match = re.search(r"at (http://\S+?)/v1", line)
            if match and not found:
                found.append(match.group(1))

    threading.Thread(target=read, daemon=True).start()
    threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()
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
    log: list[str] = []
    proc, url = start(command, log) if command else (None, args.url)
    server = Server(url)
    checks: list[tuple[str, Callable[[], int]]] = [
        ("malformed JSON", lambda: malformed_json(server)),
        ("deep JSON and huge numbers", lambda: deep_json_and_huge_numbers(server)),
        ("wrong types", lambda: wrong_types(server)),
        ("bad llama-server and Ollama input", lambda: bad_llama_and_ollama_input(server)),
        ("hostile header values", lambda: hostile_headers(server)),
        ("oversized bodies and headers", lambda: oversized(server)),
        ("chunked bodies", lambda: chunked_body(server)),
        ("HTTP/2 preface and TLS hello", lambda: http2_preface(server)),
        ("one byte at a time", lambda: one_byte_at_a_time(server, args.short)),
        ("disconnects before the body and mid-stream", lambda: disconnects(server)),
        ("a 16 MiB body while /health and a stream are timed", lambda: body_16_mib(server)),
        ("64 idle sockets, then a client", lambda: idle_sockets_then_a_client(server)),
        ("a slow-loris of 70 connections", lambda: slow_loris(server, args.short)),
        ("100 parallel connections", lambda: parallel_connections(server)),
        ("8 parallel chats", lambda: parallel_chats(server)),
    ]
    if args.long:
        checks.append(("a client that stalls after its headers", lambda: stalled_headers(server)))
    failures = cases = 0
    try:
        before = greedy_answer(server)
        for name, check in checks:
            start_time = time.monotonic()
            try:
                sent = check()
                still_alive(server)
                cases += sent
                print(f"ok    {name} ({sent} cases, {time.monotonic() - start_time:.1f} s)", flush=True)
            except (AssertionError, OSError, ValueError) as e:
                failures += 1
                print(f"FAIL  {name}: {e}", flush=True)
        after = greedy_answer(server)
        if after != before:
            failures += 1
            print(f"FAIL  the greedy answer changed: {before!r} -> {after!r}")
        else:
            print(f"ok    the server still answers, as before ({cases} cases in all)")
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
            try:
                no_internal_error("the server's log", 0, "".join(log).encode())
                assert "Traceback" not in "".join(log), "the server's log has a traceback"
            except AssertionError as e:
                failures += 1
                print(f"FAIL  {e}\n{''.join(log)[-3000:]}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
