"""Kinetic on a local Ray Serve: 2 replicas of SmolLM2 (1 thread each) behind one ingress, driven
through the openai client and compared with one single-process server (docs/scale-out.md).

Ray is the `scale` extra; CI installs it (dev pulls it in). Without it the module skips, unless
$CI or $KINETIC_REQUIRE_SCALE says the extra must be there: then it fails.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import httpx
import pytest

from tests.conftest import model_path

try:
    import ray
    from ray import serve
except ImportError:
    if os.environ.get("CI") or os.environ.get("KINETIC_REQUIRE_SCALE"):
        raise
    pytest.skip("ray[serve] is not installed (pip install 'kinetic-engine[scale]')", allow_module_level=True)

from kinetic.deploy import serve_args
from kinetic.scaleout.affinity import affinity_key
from kinetic.scaleout.ray_serve import REPLICA_HEADER, build_application
from kinetic.scaleout.routing import HashRing
from tests.server.live import serving

openai = pytest.importorskip("openai")

CONVERSATIONS, TURNS, MAX_TOKENS = 20, 3, 8
FOLLOW_UPS = ("Tell me more.", "Say it in one word.")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    """The ingress's base URL, with 2 replicas serving."""
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024 * 1024, logging_level="ERROR",
             log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    args = serve_args(str(model_path("smollm2-135m")), "-c 512")
    serve.run(build_application(args, replicas=2, threads=1), name="kinetic", route_prefix="/", blocking=False)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def reference():
    """One single-process server (create_app over the same model file, 2 threads)."""
    from kinetic.model import Model

    with serving(Model(model_path("smollm2-135m"), n_ctx=512, threads=2)) as url:
        yield url


def client_of(url: str):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def opening(i: int) -> list[dict]:
    return [{"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": f"Name one fact about the number {i}."}]


def converse(client, i: int) -> list[tuple[str, str | None]]:
    """Conversation i's three turns: [(answer, replica that served it)], each turn seeded."""
    messages, turns = opening(i), []
    for turn in range(TURNS):
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=messages, max_tokens=MAX_TOKENS, temperature=0.8, seed=1000 * i + turn)
        answer = raw.parse().choices[0].message.content
        turns.append((answer, raw.headers.get(REPLICA_HEADER)))
        messages = [*messages, {"role": "assistant", "content": answer}]
        if turn < TURNS - 1:
            messages.append({"role": "user", "content": FOLLOW_UPS[turn]})
    return turns


def run_all(url: str, workers: int = 4) -> dict[int, list]:
    client, results = client_of(url), {}

    def work(indices):
        for i in indices:
            results[i] = converse(client, i)

    threads = [threading.Thread(target=work, args=(range(w, CONVERSATIONS, workers),)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.fixture(scope="module")
def answers(cluster, reference):
    return run_all(cluster), run_all(reference, workers=1)


def test_every_answer_equals_the_single_process_servers(answers):
    """Each turn of each of 20 seeded conversations answers on the cluster exactly as on one server."""
    on_cluster, alone = answers
    assert len(on_cluster) == CONVERSATIONS == len(alone)
    for i in range(CONVERSATIONS):
        assert [a for a, _ in on_cluster[i]] == [a for a, _ in alone[i]], i


def test_later_turns_return_to_the_replica_of_turn_one(answers):
    """At least 90 % of turns 2-3 land on the replica that answered turn 1, and both replicas work."""
    on_cluster, _ = answers
    later = [(turns[0][1], replica) for turns in on_cluster.values() for _, replica in turns[1:]]
    same = sum(first == replica for first, replica in later)
    assert same >= 0.9 * len(later), later
    assert {turns[0][1] for turns in on_cluster.values()} == {"replica-0", "replica-1"}


def test_metrics_add_up_the_replicas(cluster, answers):
    """The ingress's /metrics counts every request the replicas ran and says both are up."""
    text = httpx.get(cluster + "/metrics", timeout=30).text
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(values["llamacpp:requests_total"]) >= CONVERSATIONS * TURNS
    assert values['kinetic:replica_up{replica="replica-0"}'] == values['kinetic:replica_up{replica="replica-1"}'] == "1"


def replicas(cluster) -> dict[str, dict]:
    return {row["name"]: row for row in httpx.get(cluster + "/scaleout/replicas", timeout=30).json()}


def owned_by(name: str, count: int) -> list[dict]:
    """`count` chat bodies whose affinity key the ring gives to `name`."""
    ring = HashRing()
    for replica in ("replica-0", "replica-1"):
        ring.add(replica)
    bodies = (dict(model="m", messages=opening(100 + i), max_tokens=4, seed=i) for i in range(1000))
    return [b for b in bodies if ring.owners(affinity_key(json.dumps(b).encode()))[0] == name][:count]


def test_a_killed_replica_fails_its_requests_cleanly_and_the_other_keeps_answering(cluster, answers):
    """Killing a replica mid-answer gives that request a 503 with Retry-After (no hang); requests
    meanwhile are all answered by the other; Ray brings the killed one back."""
    before = replicas(cluster)
    victim, survivor = "replica-0", "replica-1"
    long_prompt = {"prompt": owned_by(victim, 1)[0]["messages"][1]["content"], "n_predict": 400, "ignore_eos": True}
    outcome = {}

    def long_request():
        start = time.monotonic()
        answer = httpx.post(cluster + "/completion", json=long_prompt, timeout=120)
        outcome.update(status=answer.status_code, retry=answer.headers.get("retry-after"),
                       replica=answer.headers.get(REPLICA_HEADER), seconds=time.monotonic() - start)

    thread = threading.Thread(target=long_request)
    thread.start()
    deadline = time.monotonic() + 60
    while replicas(cluster)[victim]["in_flight"] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    os.kill(before[victim]["pid"], signal.SIGKILL)
    thread.join(timeout=90)
    assert not thread.is_alive(), "the killed replica's request hung"
    assert outcome["status"] == 503 and outcome["retry"], outcome

    client = client_of(cluster)  # no retries: each of these must be answered the first time
    for body in owned_by(victim, 3) + owned_by(survivor, 3):
        raw = client.chat.completions.with_raw_response.create(**body)
        assert raw.parse().choices[0].message.content is not None
        if body in owned_by(survivor, 3):
            assert raw.headers.get(REPLICA_HEADER) == survivor  # the victim's go wherever is up

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = replicas(cluster)
        if now[victim]["up"] and now[victim]["pid"] != before[victim]["pid"]:
            break
        time.sleep(1)
    else:
        pytest.fail("Ray did not bring the killed replica back within 120 s")
