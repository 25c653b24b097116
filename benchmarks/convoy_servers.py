"""Convoy through HTTP, Kinetic's server against llama-server (benchmarks/convoy.py --servers).

For each client count N: `kinetic serve FILE -np N -t T` and `llama-server -m FILE -np N -cb -t T`
(each slot 512 tokens of context) run side by side, idle but for the one being measured; each is
first warmed up by a round of N clients on other prompts (WARM_UP, 8 tokens each: what a server that
has run a while has done, e.g. Kinetic's step grown to N rows and its N-row kernels loaded, and
nothing of the measured prompts); a round sends N requests at once, one per client thread (distinct
prompts, greedy, `tokens` tokens, the end-of-turn ignored, no prompt cache), to one server, then to
the other (alternating which goes first), `repeat` rounds, each on freshly started servers: a server
that had answered the same prompts in an earlier round would answer them faster (Kinetic's Warm
Start reuses the prompt, whatever `cache_prompt` says, and RAD-1 drafts from the answers it has
seen), which is not what is measured. Printed per server and N: median aggregate generated tokens/s
(all tokens over the wall time from the first send to the last answer) and the median and worst
per-client latency (send to whole answer).

The same-answer demo, first: with -np 4, three clients keep the server busy with requests of their
own while a fourth sends one seeded request (temperature 0.8, seed 42, --demo-tokens tokens) 10
times, one after another; printed: how many distinct answers it got.

    python benchmarks/convoy.py MODEL --servers [--clients 1,2,4,8] [--tokens 128] [--threads 2]
                                                [--demo-tokens 128 (0: no demo)] [--kinetic-off rad1]
"""

from __future__ import annotations

import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from convoy_prompts import PROMPTS

from kinetic.hub import resolve_model

LLAMA_SERVER = Path.home() / ".cache/kinetic-ref/llama.cpp/build/bin/llama-server"
SEEDED = {"prompt": "Write a poem about the wind in the trees.", "temperature": 0.8, "seed": 42}
CONTEXT_PER_SLOT = 512
WARM_UP = [f"Warm-up request {i}: name a colour and a number." for i in range(16)]


class Server:
    """A server process and its base URL; stop() ends it."""

    def __init__(self, name: str, command: list[str], url: str | None = None):
        self.name = name
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if url is None:  # kinetic serve prints its address once it listens
            line = self.proc.stdout.readline()
            match = re.search(r"at (http://\S+)/v1$", line.strip())
            if match is None:
                self.stop()
                raise SystemExit(f"kinetic serve did not start: {line!r}")
            url = match.group(1)
        else:
            threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        self.url = url
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        end = time.monotonic() + 300
        while time.monotonic() < end:
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited while starting")
            time.sleep(0.2)
        raise SystemExit(f"{self.name} did not become healthy")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_servers(path: str, slots: int, threads: int, kinetic_off: str | None = None) -> list[Server]:
    off = ["--off", kinetic_off] if kinetic_off else []
    kinetic = Server("kinetic", [sys.executable, "-m", "kinetic.cli.main", "serve", path, "--port", "0",
                                 "-np", str(slots), "-t", str(threads), "-c", str(CONTEXT_PER_SLOT), "--device", "cpu",
                                 *off])
    port = _free_port()
    llama = Server("llama-server", [str(LLAMA_SERVER), "-m", path, "-np", str(slots), "-cb", "-t", str(threads),
                                    "-c", str(CONTEXT_PER_SLOT * slots), "--host", "127.0.0.1", "--port", str(port)],
                   url=f"http://127.0.0.1:{port}")
    return [kinetic, llama]


def _complete(url: str, body: dict) -> tuple[float, int, str]:
    """(seconds, tokens generated, text) of one /completion."""
    start = time.perf_counter()
    reply = httpx.post(url + "/completion", json=body, timeout=600)
    reply.raise_for_status()
    answer = reply.json()
    return time.perf_counter() - start, int(answer["tokens_predicted"]), answer["content"]


def one_round(url: str, clients: int, tokens: int, prompts: list[str] = PROMPTS) -> tuple[float, list[float]]:
    """(aggregate tokens/s, each client's latency) of `clients` requests sent at once."""
    bodies = [{"prompt": prompts[i % len(prompts)], "n_predict": tokens, "temperature": 0, "ignore_eos": True,
               "cache_prompt": False} for i in range(clients)]
    results: list = [None] * clients
    go = threading.Barrier(clients)

    def client(i: int) -> None:
        go.wait()
        results[i] = _complete(url, bodies[i])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return sum(r[1] for r in results) / wall, [r[0] for r in results]


def same_answer_demo(url: str, tokens: int, sends: int = 10) -> int:
    """Distinct answers of the seeded request (`tokens` tokens) sent `sends` times while 3 clients keep
    the server busy with requests of `tokens` tokens."""
    stop = threading.Event()

    def busy(i: int) -> None:
        while not stop.is_set():
            _complete(url, {"prompt": PROMPTS[i], "n_predict": tokens, "temperature": 0.7, "seed": i})

    helpers = [threading.Thread(target=busy, args=(i,), daemon=True) for i in range(3)]
    for h in helpers:
        h.start()
    time.sleep(0.5)
    try:
        answers = {_complete(url, {**SEEDED, "n_predict": tokens})[2] for _ in range(sends)}
    finally:
        stop.set()
        for h in helpers:
            h.join()
    return len(answers)


def compare_servers(model: str, client_counts: list[int], tokens: int, threads: int, repeat: int,
                    demo_tokens: int, kinetic_off: str | None = None) -> None:
    """`demo_tokens` 0 skips the demo; `kinetic_off`: kinetic serve's --off list (a diagnosis: the
    comparison itself runs both servers as they start by default)."""
    if not LLAMA_SERVER.exists():
        raise SystemExit(f"llama-server not found at {LLAMA_SERVER}")
    path = str(resolve_model(model))
    print(f"{Path(path).name}, {threads} threads, {tokens} tokens per client, medians of {repeat}; "
          f"load before: {os.getloadavg()[0]:.2f}")
    servers = start_servers(path, 4, threads, kinetic_off) if demo_tokens else []
    try:
        for s in servers:
            print(f"same-answer demo ({demo_tokens} tokens), {s.name}: {same_answer_demo(s.url, demo_tokens)} "
                  "distinct answers of 10", flush=True)
    finally:
        for s in servers:
            s.stop()
    print(f"{'clients':>7} {'server':>13} {'aggregate tok/s':>16} {'latency median s':>17} {'latency worst s':>16}")
    for n in client_counts:
        speeds: dict[str, list[float]] = {}
        latencies: dict[str, list[float]] = {}
        for r in range(repeat):  # fresh servers each round: no round sees the prompts of another
            servers = start_servers(path, n, threads, kinetic_off)
            try:
                for s in servers:
                    one_round(s.url, n, 8, WARM_UP)
                for s in servers if r % 2 == 0 else servers[::-1]:
                    speed, lat = one_round(s.url, n, tokens)
                    speeds.setdefault(s.name, []).append(speed)
                    latencies.setdefault(s.name, []).extend(lat)
            finally:
                for s in servers:
                    s.stop()
        for name in speeds:
            lat = latencies[name]
            print(f"{n:>7} {name:>13} {statistics.median(speeds[name]):>16.1f} "
                  f"{statistics.median(lat):>17.2f} {max(lat):>16.2f}", flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}")
