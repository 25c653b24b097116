"""Warm Start against llama-server's prompt cache (issue 22's Done-when benchmark): time to first
token per turn of 4 conversations interleaved, 5 turns each, each with its own long system prompt
(1,000 to 2,000 tokens), through HTTP with the openai package, greedy, one request at a time.

    python benchmarks/warm_start.py [MODEL] [--threads 2] [--answer-tokens 32] [--phases LIST]
                                    [--llama-server PATH] [--json FILE]

Phases (all by default, in this order, each on a fresh server of its own, same file and threads):

    kinetic-cold     kinetic serve --no-prompt-cache: every prompt from its first token
    kinetic-warm     kinetic serve --cache-dir EMPTY: Warm Start on, its disk tier starting empty
    kinetic-restart  a new kinetic serve on the same --cache-dir, replaying the warm phase's
                     conversations (its memory tier is empty: states come from the disk tier)
    kinetic-prefill  kinetic serve --cache-dir EMPTY2; before each request, POST /v1/prefill with
                     its body (Zero Wait: the prompt run while it is typed), then the request
    llama-server     llama-server with its prompt cache on: 4 slots (-np 4) chosen by prompt
                     similarity, --cache-reuse 256, the host-memory prompt cache (--cache-ram 8192)

Per phase and turn it prints the median TTFT over the 4 conversations and the prompt and cached
tokens the server reported (usage.prompt_tokens_details.cached_tokens, else llama-server's
timings.cache_n), then the ratios the issue sets goals for. Every phase after the first replays the
first phase's conversation (its answers as the assistant's turns) so all servers see the same
prompts. The TTFT clock runs from sending the request to the first streamed text.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from openai import OpenAI

from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.tokenizer import Tokenizer
from kinetic.hub import resolve_model

LLAMA_SERVER = Path.home() / ".cache/kinetic-ref/llama.cpp/build/bin/llama-server"
PHASES = ("kinetic-cold", "kinetic-warm", "kinetic-restart", "kinetic-prefill", "llama-server")
CONVERSATIONS = 4
TURNS = 5
SYSTEM_TOKENS = (1000, 1300, 1600, 1900)  # one per conversation
TOPICS = ("a mountain railway", "a city library", "a coastal weather station", "a small bakery")
QUESTIONS = ("Who are you and what do you look after?", "What is the most important rule for a visitor?",
             "Summarise rule 3 in one sentence.", "What should I do if something goes wrong?",
             "Thank you. Any last advice?")
WORDS = ("ticket", "timetable", "lantern", "ledger", "harbour", "window", "schedule", "receipt", "bridge",
         "signal", "archive", "oven", "barometer", "platform", "catalogue", "flour", "rainfall", "visitor")


@dataclass
class Turn:
    phase: str
    conversation: int
    turn: int
    ttft_ms: float
    prompt_tokens: int
    cached_tokens: int
    answer: str


def system_prompt(tokenizer: Tokenizer, conversation: int) -> str:
    """A deterministic instruction text of about SYSTEM_TOKENS[conversation] tokens."""
    rng = np.random.default_rng(conversation)
    lines = [f"You are the assistant of {TOPICS[conversation]}. Follow these house rules exactly."]
    while len(tokenizer.encode("\n".join(lines))) < SYSTEM_TOKENS[conversation]:
        a, b, c = rng.choice(WORDS, 3, replace=False)
        lines.append(f"Rule {len(lines)}: when a guest mentions the {a}, check the {b} first, "
                     f"then explain the {c} politely and briefly.")
    return "\n".join(lines)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server process on a free port, its output in a log file; stopped with SIGTERM."""

    def __init__(self, argv: list[str], log: Path):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "w") as out:
            self.process = subprocess.Popen([*argv, "--port", str(self.port)], stdout=out, stderr=subprocess.STDOUT)
        self._wait_healthy()
        self.client = OpenAI(base_url=f"{self.base}/v1", api_key="none", timeout=600)

    def _wait_healthy(self, seconds: float = 600) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"server exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base}/health", timeout=5) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise SystemExit(f"server not healthy after {seconds:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(f"{self.base}{path}", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as answer:
            return json.loads(answer.read())

    def stop(self) -> None:
        """Ctrl+C, as a user stops it (Kinetic finishes its queued state files on the way out)."""
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def ask(server: Server, messages: list[dict], answer_tokens: int) -> tuple[float, str, int, int]:
    """(TTFT in ms, the answer, prompt tokens, cached tokens) of one streamed greedy request."""
    began = time.perf_counter()
    first, parts, usage, timings = None, [], None, None
    stream = server.client.chat.completions.create(
        model="bench", messages=messages, max_tokens=answer_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True})
    for chunk in stream:
        text = chunk.choices[0].delta.content if chunk.choices else None
        if text:
            first = first or time.perf_counter()
            parts.append(text)
        usage = chunk.usage or usage
        timings = (chunk.model_extra or {}).get("timings") or timings
    first = first or time.perf_counter()
    details = getattr(usage, "prompt_tokens_details", None) if usage else None
    cached = getattr(details, "cached_tokens", None)
    if cached is None and timings:
        cached = timings.get("cache_n", 0)
    return (first - began) * 1000, "".join(parts), usage.prompt_tokens if usage else 0, cached or 0


def run_phase(phase: str, server: Server, systems: list[str], answers: dict | None, args) -> list[Turn]:
    """The 4 conversations interleaved, turn by turn; `answers` (from an earlier phase) are replayed
    as the assistant's turns, else the server's own answers are."""
    history = [[{"role": "system", "content": s}] for s in systems]
    turns = []
    for t in range(TURNS):
        for c in range(CONVERSATIONS):
            messages = history[c] + [{"role": "user", "content": QUESTIONS[t]}]
            if phase == "kinetic-prefill":
                server.post("/v1/prefill", {"model": "bench", "messages": messages})
            ttft, answer, prompt, cached = ask(server, messages, args.answer_tokens)
            answer = answers[(c, t)] if answers else answer
            history[c] = messages + [{"role": "assistant", "content": answer}]
            turns.append(Turn(phase, c, t + 1, ttft, prompt, cached, answer))
            print(f"  {phase} conversation {c + 1} turn {t + 1}: {ttft:8.1f} ms, {cached}/{prompt} cached",
                  flush=True)
    return turns


def server_argv(phase: str, model: Path, cache: Path, args) -> list[str]:
    if phase == "llama-server":
        return [str(args.llama_server), "-m", str(model), "-t", str(args.threads), "-tb", str(args.threads),
                "-c", str(CONVERSATIONS * args.ctx), "-np", str(CONVERSATIONS), "--cache-reuse", "256",
                "--cache-ram", "8192", "--host", "127.0.0.1"]
    kinetic = [str(Path(sys.executable).parent / "kinetic"), "serve", str(model), "-t", str(args.threads),
               "-c", str(args.ctx), "-np", str(CONVERSATIONS)]
    if phase == "kinetic-cold":
        return kinetic + ["--no-prompt-cache"]
    folder = cache / ("prefill" if phase == "kinetic-prefill" else "warm")
    return kinetic + ["--cache-dir", str(folder)]


def median_ttft(turns: list[Turn], phase: str, which: set[int]) -> float | None:
    values = [t.ttft_ms for t in turns if t.phase == phase and t.turn in which]
    return statistics.median(values) if values else None


def report(turns: list[Turn]) -> None:
    phases = [p for p in PHASES if any(t.phase == p for t in turns)]
    print(f"\nmedian TTFT (ms) over {CONVERSATIONS} conversations, cached/prompt tokens summed over them")
    print(f"{'turn':>4} " + " ".join(f"{p:>26}" for p in phases))
    for n in range(1, TURNS + 1):
        cells = []
        for p in phases:
            rows = [t for t in turns if t.phase == p and t.turn == n]
            cached, prompt = sum(t.cached_tokens for t in rows), sum(t.prompt_tokens for t in rows)
            cells.append(f"{median_ttft(turns, p, {n}):9.1f} ({cached:5d}/{prompt:5d})")
        print(f"{n:>4} " + " ".join(f"{c:>26}" for c in cells))
    later, every = {2, 3, 4, 5}, set(range(1, TURNS + 1))
    goals = [("llama-server / kinetic-warm, turns 2-5", "llama-server", "kinetic-warm", later),
             ("kinetic-cold / kinetic-warm, turns 2-5", "kinetic-cold", "kinetic-warm", later),
             ("kinetic-cold / kinetic-restart, all turns", "kinetic-cold", "kinetic-restart", every),
             ("kinetic-cold / kinetic-prefill, all turns", "kinetic-cold", "kinetic-prefill", every)]
    for label, slower, faster, which in goals:
        a, b = median_ttft(turns, slower, which), median_ttft(turns, faster, which)
        print(f"{label:>42}: " + ("-" if a is None or not b else f"{a / b:.2f}x"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=4096, help="context per conversation [default: 4096]")
    parser.add_argument("--answer-tokens", type=int, default=32, help="most tokens per answer [default: 32]")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated from {', '.join(PHASES)}")
    parser.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    parser.add_argument("--json", type=Path, help="also write every turn's numbers here")
    args = parser.parse_args()
    phases = [p.strip() for p in args.phases.split(",")]
    if unknown := set(phases) - set(PHASES):
        parser.error(f"unknown phases: {', '.join(sorted(unknown))}")
    if "llama-server" in phases and not args.llama_server.is_file():
        print(f"no llama-server at {args.llama_server}: that phase is skipped")
        phases.remove("llama-server")
    model = resolve_model(args.model)
    systems = [system_prompt(Tokenizer.from_gguf(open_gguf(model)), c) for c in range(CONVERSATIONS)]
    print(f"{model.name}, {args.threads} threads, system prompts of "
          f"{', '.join(str(n) for n in SYSTEM_TOKENS)} tokens, answers of at most {args.answer_tokens} tokens")
    cache = Path(tempfile.mkdtemp(prefix="kinetic-warm-bench-"))
    turns: list[Turn] = []
    answers = None
    try:
        for phase in phases:
            server = Server(server_argv(phase, model, cache, args), cache / f"{phase}.log")
            try:
                ran = run_phase(phase, server, systems, answers, args)
            finally:
                server.stop()
            answers = answers or {(t.conversation, t.turn - 1): t.answer for t in ran}
            turns += ran
            if phase == "kinetic-warm":
                files = list((cache / "warm").glob("*.kwarm"))
                size = sum(f.stat().st_size for f in files) / 2**20
                print(f"  disk tier after the warm phase: {len(files)} state files, {size:.1f} MiB")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    report(turns)
    if args.json:
        args.json.write_text(json.dumps([asdict(t) for t in turns], indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
