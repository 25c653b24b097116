"""Convoy's limits through HTTP: the queue bound (503 with Retry-After in each API's error shape,
requests_deferred on /metrics) and a request whose client goes away (a closed stream, a
non-streaming client that disconnects) leaving its slot at once while the request beside it still
gets its answer alone."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx
import pytest

from kinetic.server.options import ServerOptions
from tests.server.live import serving

LONG = {"prompt": "Tell me a very long story about the sea.", "n_predict": 4000, "temperature": 0,
        "ignore_eos": True}
BESIDE = {"prompt": "The capital of France is", "n_predict": 24, "temperature": 0.7, "seed": 5}

# one request to each API, as a client would send it; the body a full queue answers, per API
BUSY_CALLS = {
    "openai": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
               lambda b: b["error"]["type"] == "unavailable_error" and "busy" in b["error"]["message"]),
    "llama-server": ("/completion", {"prompt": "Hi", "n_predict": 4},
                     lambda b: b["error"]["code"] == 503 and "busy" in b["error"]["message"]),
    "ollama": ("/api/generate", {"model": "m", "prompt": "Hi", "stream": False},
               lambda b: isinstance(b["error"], str) and "busy" in b["error"]),
    "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
                  lambda b: b["type"] == "error" and b["error"]["type"] == "overloaded_error"),
}


@pytest.fixture(scope="module")
def model():
    from kinetic.model import Model
    from tests.conftest import model_path

    return Model(model_path("smollm2-135m"), n_ctx=4096, threads=2)  # room for LONG: ~20 s of decode


def _gauge(c: httpx.Client, name: str) -> int:
    line = next(x for x in c.get("/metrics").text.splitlines() if x.startswith(f"llamacpp:{name} "))
    return int(float(line.split()[1]))


def _until(check, seconds: float = 60.0) -> None:
    end = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.02)


def _slot(c: httpx.Client, slot_id: int) -> dict:
    return next(s for s in c.get("/slots").json() if s["id"] == slot_id)


def _stream_first_then_close(url: str, body: dict, started: threading.Event | None = None,
                             go: threading.Event | None = None) -> None:
    """Streams `body`, reads its first event and closes the connection (a client cancelling); with
    `started` and `go`, it signals `started` after the first event and closes only once `go` is set."""
    with httpx.Client(base_url=url, timeout=120) as c, \
            c.stream("POST", "/completion", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                if started is not None:
                    started.set()
                    go.wait(120)
                return


def test_full_queue_answers_503_with_retry_after_in_each_api_shape(model):
    """With its one slot busy and its queue (--max-queue 1) full, the server answers every API 503
    with a Retry-After of whole seconds and the API's own error shape; /metrics counts the waiting
    request as deferred; once the running request is cancelled the waiting one runs."""
    with serving(model, ServerOptions(parallel=1, max_queued=1)) as url, httpx.Client(base_url=url, timeout=120) as c:
        waiting_reply: list = []
        with httpx.Client(base_url=url, timeout=120) as long_client, \
                long_client.stream("POST", "/completion", json={**LONG, "stream": True}) as stream:
            lines = stream.iter_lines()  # held: a dropped iterator would close the stream
            next(line for line in lines if line.startswith("data: "))  # it runs
            waiting = threading.Thread(target=lambda: waiting_reply.append(c.post("/completion", json=BESIDE)))
            waiting.start()
            _until(lambda: _gauge(c, "requests_deferred") == 1)
            assert _gauge(c, "requests_processing") == 1
            for api, (path, body, shaped) in BUSY_CALLS.items():
                reply = httpx.post(url + path, json=body, timeout=60)
                assert reply.status_code == 503, (api, reply.status_code, reply.text)
                assert int(reply.headers["Retry-After"]) >= 1, api
                assert shaped(reply.json()), (api, reply.json())
        waiting.join(timeout=120)  # the stream closed: the running request left, the waiting one ran
        assert waiting_reply and waiting_reply[0].status_code == 200
        assert _gauge(c, "requests_deferred") == 0


@pytest.mark.parametrize("how", ["stream closed", "client disconnected"])
def test_client_that_leaves_frees_its_slot_at_once(model, how):
    """A request whose client goes away (closing its stream after the first token, or a
    non-streaming client disconnecting) leaves its slot within a few passes of 4000 tokens (its slot
    stops processing having decoded far fewer), while the request sharing its passes gets its
    answer alone."""
    with serving(model, ServerOptions(parallel=2)) as url, httpx.Client(base_url=url, timeout=120) as c:
        alone = c.post("/completion", json=BESIDE).json()["content"]
        beside: list = []
        other = threading.Thread(target=lambda: beside.append(httpx.post(url + "/completion", json=BESIDE,
                                                                          timeout=120)))
        started, go = threading.Event(), threading.Event()
        if how == "stream closed":
            leaver = threading.Thread(target=_stream_first_then_close, args=(url, LONG, started, go))
        else:
            def leave() -> None:
                with pytest.raises(httpx.ReadTimeout):  # httpx closes the connection on its timeout
                    started.set()
                    go.wait(120)
                    httpx.post(url + "/completion", json=LONG, timeout=httpx.Timeout(120, read=2.0))
            leaver = threading.Thread(target=leave)
            go.set()  # it leaves 2 s after sending, whatever else runs
        leaver.start()
        started.wait(120)
        # which slot the long request holds, known before anything else could take a freed slot
        slot_id: list = []

        def long_slot_found() -> bool:
            slot_id[:] = [s["id"] for s in c.get("/slots").json()
                          if s["is_processing"] and s.get("params", {}).get("n_predict") == LONG["n_predict"]]
            return bool(slot_id)

        _until(long_slot_found)
        other.start()
        if how == "stream closed":
            _until(lambda: _gauge(c, "requests_processing") == 2)  # both share passes, then the client leaves
            go.set()
        leaver.join(timeout=120)
        _until(lambda: not _slot(c, slot_id[0])["is_processing"], seconds=10)
        decoded = _slot(c, slot_id[0])["next_token"][0]["n_decoded"]
        other.join(timeout=120)
    assert decoded < LONG["n_predict"] // 3, f"{decoded} tokens decoded after the client left"
    assert beside[0].status_code == 200 and beside[0].json()["content"] == alone


def test_negative_queue_bound_is_refused_before_loading(tmp_path):
    """`--max-queue -1` exits 1 with a `kinetic: ` line naming the flag (before any model loads)."""
    proc = subprocess.run([sys.executable, "-m", "kinetic.cli.main", "serve", str(tmp_path / "missing.gguf"),
                           "--max-queue", "-1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.startswith("kinetic: --max-queue must be 0 or more")
