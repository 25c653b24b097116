"""Convoy through the live server: concurrent HTTP requests share the engine's passes and each gets
bit for bit the answer it gets alone; /slots lists every slot and /metrics counts the requests
processing at once."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from kinetic.server.options import ServerOptions
from tests.server.live import serving

BODIES = [
    {"prompt": "The capital of France is", "n_predict": 12, "temperature": 0},
    {"prompt": "Once upon a time", "n_predict": 16, "temperature": 0.9, "seed": 7},
    {"prompt": "Count: one, two, three, four, five, one, two, three,", "n_predict": 14, "temperature": 0},
    {"prompt": "Write a list of fruits:", "n_predict": 10, "temperature": 0.8, "seed": 3,
     "grammar": 'root ::= " " [a-z]+ ("," " " [a-z]+)*'},
    {"prompt": "The weather today", "n_predict": 8, "temperature": 0.7, "seed": 11, "stream": True},
]


def _answer(c: httpx.Client, body: dict) -> tuple[str, tuple]:
    if not body.get("stream"):
        reply = c.post("/completion", json=body).json()
        return reply["content"], tuple(reply["tokens"])
    with c.stream("POST", "/completion", json=body) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    return "".join(e["content"] for e in events), tuple(t for e in events for t in e.get("tokens", []))


def _processing(c: httpx.Client) -> int:
    line = next(x for x in c.get("/metrics").text.splitlines() if x.startswith("llamacpp:requests_processing "))
    return int(float(line.split()[1]))


@pytest.fixture(scope="module")
def model():
    from kinetic.model import Model
    from tests.conftest import model_path

    return Model(model_path("smollm2-135m"), n_ctx=512, threads=2)


def test_concurrent_requests_equal_their_answers_alone(model):
    """Five requests (greedy, seeded, a grammar, streamed) sent at once to a server with 4 slots each
    get the answer they get sent alone; meanwhile /metrics saw several requests processing at once
    and /slots lists the 4 slots."""
    with serving(model, ServerOptions(parallel=4)) as url, httpx.Client(base_url=url, timeout=300) as c:
        expected = [_answer(c, b) for b in BODIES]
        got: list = [None] * len(BODIES)
        seen_processing: list[int] = []

        def send(i: int) -> None:
            with httpx.Client(base_url=url, timeout=300) as own:
                got[i] = _answer(own, BODIES[i])

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(BODIES))]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            seen_processing.append(_processing(c))
        for t in threads:
            t.join()
        slots = c.get("/slots").json()
    assert got == expected
    assert max(seen_processing) >= 2, f"never more than one request processing: {seen_processing}"
    assert [s["id"] for s in slots] == [0, 1, 2, 3] and not any(s["is_processing"] for s in slots)
