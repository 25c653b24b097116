"""Convoy through the live server: concurrent HTTP requests share the engine's passes and each gets
bit for bit the answer it gets alone; /slots lists every slot and /metrics counts the requests
processing at once."""

from __future__ import annotations

import json
import random
import threading
import time

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


# eight requests of different prompt and answer lengths (greedy and seeded, two streamed)
EIGHT = [{"prompt": text, "n_predict": n, "temperature": temp, "seed": seed, "stream": stream}
         for text, n, temp, seed, stream in (
             ("Hi", 3, 0, 1, False),
             ("The capital of France is", 40, 0, 1, False),
             ("Once upon a time, in a land far away, there lived a", 17, 0.8, 42, True),
             ("Write a haiku about the sea:", 28, 0.9, 7, False),
             ("List three colors and one animal that has each of them:", 9, 0, 1, True),
             ("Explain why the sky is blue in one paragraph. " * 6, 22, 0.7, 3, False),
             ("2 + 2 =", 5, 0.5, 11, False),
             ("A recipe for bread: first,", 33, 0, 1, False))]


def _concurrently(url: str, bodies: list[dict]) -> list[tuple[str, tuple]]:
    got: list = [None] * len(bodies)

    def send(i: int) -> None:
        with httpx.Client(base_url=url, timeout=300) as own:
            got[i] = _answer(own, bodies[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_eight_concurrent_requests_of_different_lengths_equal_their_answers_alone(model):
    """Eight requests of different prompt and answer lengths, sent at once to a server with 8 slots,
    each get bit for bit the answer they get alone."""
    with serving(model, ServerOptions(parallel=8)) as url, httpx.Client(base_url=url, timeout=300) as c:
        expected = [_answer(c, b) for b in EIGHT]
        got = _concurrently(url, EIGHT)
    assert got == expected


def test_completion_names_the_slot_that_ran_it(model):
    """With 2 slots, a request sent while another streams runs in the other slot: the two answers'
    id_slot differ (the stream's chunks and its last message agree), and /slots shows each answer's
    prompt in the slot its id_slot names."""
    first = {"prompt": "Once upon a time", "n_predict": 96, "ignore_eos": True, "temperature": 0, "stream": True}
    second = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0}
    with serving(model, ServerOptions(parallel=2)) as url, httpx.Client(base_url=url, timeout=300) as c:
        with httpx.Client(base_url=url, timeout=300) as own, own.stream("POST", "/completion", json=first) as r:
            lines = (json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: "))
            streamed = [next(lines)]  # the first request runs now
            alone = c.post("/completion", json=second).json()
            streamed += list(lines)
        slots = c.get("/slots").json()
    stream_slots = {e["id_slot"] for e in streamed}
    assert len(stream_slots) == 1 and stream_slots != {alone["id_slot"]}
    assert slots[alone["id_slot"]]["prompt"] == alone["prompt"]
    assert slots[streamed[-1]["id_slot"]]["prompt"] == streamed[-1]["prompt"]


@pytest.mark.slow
def test_soak_eight_clients_for_two_minutes(model):
    """Eight clients sending requests of mixed lengths back to back for two minutes, each arriving
    while others run: every answer equals its answer alone, none fails, and at the end /metrics
    counts every request and shows nothing processing or deferred."""
    with serving(model, ServerOptions(parallel=8)) as url, httpx.Client(base_url=url, timeout=300) as c:
        expected = [_answer(c, b) for b in EIGHT]
        before = _metric(c, "requests_total")
        wrong: list = []
        sent = [0] * 8
        end = time.monotonic() + 120

        def client(k: int) -> None:
            pick = random.Random(k)
            with httpx.Client(base_url=url, timeout=300) as own:
                while time.monotonic() < end:
                    i = pick.randrange(len(EIGHT))
                    answer = _answer(own, EIGHT[i])
                    sent[k] += 1
                    if answer != expected[i]:
                        wrong.append((i, answer))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        total = _metric(c, "requests_total") - before
        idle = (_metric(c, "requests_processing"), _metric(c, "requests_deferred"))
    assert not wrong, f"{len(wrong)} answers differed from their answers alone: {wrong[:2]}"
    assert total == sum(sent) and min(sent) > 0 and idle == (0, 0)


def _metric(c: httpx.Client, name: str) -> int:
    line = next(x for x in c.get("/metrics").text.splitlines() if x.startswith(f"llamacpp:{name} "))
    return int(float(line.split()[1]))
