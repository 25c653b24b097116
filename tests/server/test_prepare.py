"""Preparing requests off the event loop (kinetic/server/offload.py, fit.py, prompts.py): prompts
that cannot fit are refused before tokenizing, a 16 MiB body does not stall /health or another
client's stream, memory returns after large requests, and the pool is bounded and cancellable."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time

import pytest

from kinetic.server.errors import ApiError
from kinetic.server.http import bind, make_server
from kinetic.server.offload import CpuPool
from kinetic.server.options import ServerOptions

BIG_CHAT = {"messages": [{"role": "user", "content": "hello world " * 1_390_000}], "max_tokens": 1}  # 16.7 MB


@pytest.fixture(scope="module")
def live(model):
    """create_app(model) served by uvicorn in this process; yields its port."""
    from kinetic.server import create_app

    sock = bind("127.0.0.1", 0)
    server = make_server(create_app(model, ServerOptions()), ServerOptions())
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(timeout=10)


def call(port: int, method: str, path: str, body: bytes | dict | None = None, timeout: float = 120):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    try:
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def rss_mb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS"))


# -- prompts that cannot fit -------------------------------------------------------------------------


OVERSIZED = "hello world " * 20_000  # 240 kB: more than 512 tokens of even the longest SmolLM2 token (162 bytes)
ROUTES = [("/v1/chat/completions", {"messages": [{"role": "user", "content": OVERSIZED}]}),
          ("/v1/completions", {"prompt": OVERSIZED}),
          ("/completion", {"prompt": ["hi", 1, OVERSIZED]}),
          ("/api/generate", {"prompt": OVERSIZED, "raw": True, "stream": False}),
          ("/api/chat", {"messages": [{"role": "user", "content": OVERSIZED}], "stream": False})]


@pytest.mark.parametrize("path,body", ROUTES, ids=[r[0] for r in ROUTES])
def test_prompt_that_cannot_fit_is_refused_before_tokenizing(live, model, monkeypatch, path, body):
    """A prompt whose byte length proves it needs more tokens than the context holds is refused with
    the API's context error (OpenAI's context_length_exceeded on /v1, llama-server's
    exceed_context_size_error on its routes), and the tokenizer never sees it."""
    seen = []
    tokenize = model.tokenize
    monkeypatch.setattr(model, "tokenize", lambda text, **kw: seen.append(len(text)) or tokenize(text, **kw))
    status, answer = call(live, "POST", path, body)
    assert status == 400
    assert all(n < 1000 for n in seen), f"the tokenizer was given {max(seen)} characters"
    if path.startswith("/api/"):
        assert "longer than the context length" in answer["error"]
    else:
        error = answer["error"]
        assert _context_error(path, error) and error["n_ctx"] == 512
        assert error["n_prompt_tokens"] >= 512


def test_prompt_longer_than_the_context_after_tokenizing_has_the_exact_count(live):
    """A prompt that passes the byte bound but not the exact count gets the same error with its token count."""
    status, answer = call(live, "POST", "/v1/completions", {"prompt": "hi " * 600})
    assert status == 400 and _context_error("/v1/completions", answer["error"])
    assert answer["error"]["n_prompt_tokens"] > 512 and "at least" not in answer["error"]["message"]


def _context_error(path: str, error: dict) -> bool:
    if path.startswith("/v1/"):
        return error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error"
    return error["type"] == "exceed_context_size_error"


# -- a 16 MiB body -----------------------------------------------------------------------------------


def test_a_16_mib_chat_stalls_neither_health_nor_another_stream(live):
    """While a 16.7 MB chat body is read, parsed, rendered and refused, /health answers within 1.5 s
    and another client's stream keeps sending (before: both waited ~11 s)."""
    big = json.dumps(BIG_CHAT).encode()
    health, gaps, done, streaming = [], [], threading.Event(), threading.Event()

    def probe_health():
        while not done.is_set():
            start = time.perf_counter()
            call(live, "GET", "/health", timeout=60)
            health.append(time.perf_counter() - start)
            time.sleep(0.02)

    def stream():
        conn = http.client.HTTPConnection("127.0.0.1", live, timeout=60)
        body = {"prompt": "Once upon a time", "n_predict": 400, "ignore_eos": True, "stream": True}
        conn.request("POST", "/completion", body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        for _ in range(3):  # the stream's first tokens (its prompt, first-use work) come before the timing
            response.readline()
        streaming.set()
        last = time.perf_counter()
        while not done.is_set() and response.readline():
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
        conn.close()

    threads = [threading.Thread(target=probe_health), threading.Thread(target=stream)]
    for t in threads:
        t.start()
    assert streaming.wait(timeout=60), "the other stream never started"
    status, answer = call(live, "POST", "/v1/chat/completions", big)
    time.sleep(0.3)
    done.set()
    for t in threads:
        t.join(timeout=60)
    assert status == 400 and _context_error("/v1/chat/completions", answer["error"])
    assert max(health) < 1.5, f"/health took {max(health):.2f} s during the 16 MiB request"
    assert gaps and max(gaps) < 1.5, f"the other stream stalled {max(gaps):.2f} s"


def test_memory_returns_after_large_requests(live):
    """Five 16.7 MB chat bodies leave the resident size within 150 MB of where it started (before:
    each kept about 1.2 GB of tokenizer and body buffers)."""
    big = json.dumps(BIG_CHAT).encode()
    call(live, "POST", "/v1/chat/completions", big)  # warm: the renderer, first-use caches
    before = rss_mb()
    for _ in range(5):
        assert call(live, "POST", "/v1/chat/completions", big)[0] == 400
    time.sleep(0.5)
    assert rss_mb() - before < 150, f"resident size went from {before} MB to {rss_mb()} MB"


def test_tokenizing_leaves_the_gil_to_other_threads(model):
    """Tokenizing a long text on one thread leaves the GIL to the others (the event loop) for most
    of the time: the longest pause another thread sees is under half the tokenizing time."""
    text = "hello world " * 300_000
    tokenizer = model.tokenizer
    finished = threading.Event()
    took = []

    def work():
        start = time.perf_counter()
        tokenizer.encode(text, add_special=True, parse_special=True)
        took.append(time.perf_counter() - start)
        finished.set()

    gaps, last = [], time.perf_counter()
    threading.Thread(target=work).start()
    while not finished.is_set():
        time.sleep(0.002)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    assert max(gaps) < took[0] / 2, f"another thread waited {max(gaps):.2f} s of {took[0]:.2f} s"


# -- the pool ----------------------------------------------------------------------------------------


def test_pool_refuses_beyond_its_bound_with_503():
    """With every thread busy and every waiting place taken, one more request is a 503, not a queue
    that grows without limit."""
    async def main():
        pool, release = CpuPool(workers=1, max_waiting=1), threading.Event()
        busy = [asyncio.ensure_future(pool.run(lambda cancel: release.wait(5))) for _ in range(3)]  # 1 + 1 + large
        await asyncio.sleep(0.1)
        with pytest.raises(ApiError) as refused:
            await pool.run(lambda cancel: None)
        release.set()
        await asyncio.gather(*busy)
        return refused.value.status

    assert asyncio.run(main()) == 503


def test_pool_tells_the_work_its_client_left():
    """When the client disconnects, the running work's cancel flag turns true (a render is then stopped)."""
    async def main():
        pool, saw = CpuPool(), []
        gone = asyncio.Event()

        async def receive():
            await gone.wait()
            return {"type": "http.disconnect"}

        def work(cancel):
            deadline = time.monotonic() + 5
            while not cancel() and time.monotonic() < deadline:
                time.sleep(0.01)
            saw.append(cancel())

        task = asyncio.ensure_future(pool.run(work, receive=receive))
        await asyncio.sleep(0.1)
        gone.set()
        await task
        return saw

    assert asyncio.run(main()) == [True]


def test_large_requests_take_turns_without_holding_up_small_ones():
    """A large request's preparation runs on its own thread: a small one finishes while it runs."""
    async def main():
        pool, release = CpuPool(workers=1), threading.Event()
        large = asyncio.ensure_future(pool.run(lambda cancel: release.wait(5), large=True))
        await asyncio.sleep(0.05)
        small = await asyncio.wait_for(pool.run(lambda cancel: "small"), timeout=2)
        release.set()
        await large
        return small

    assert asyncio.run(main()) == "small"
