"""llama.cpp's side of the edit test for `kinetic bench --compare`: the same request to llama-server,
greedy and streamed, with one of its speculative modes, a fresh server for each run.

Owns: llama-server's command line for the test, starting it and always stopping it (`llama_server`),
the speculative modes this build offers (`spec_types`), streaming the request and timing it with the
clock Kinetic's side uses (`stream_edit`), and `LlamaEditResult` (`not_run` says why it did not run).
Does not own: finding the program (kinetic.bench_llama), the request itself and Kinetic's side
(kinetic.bench_edit), the card (kinetic.bench_card).
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from kinetic.bench_edit import EDIT_REQUEST, FirstToLast, rate
from kinetic.errors import KineticError

LLAMA_SPEC_DEFAULT = "ngram-mod"
SERVER_START_SECONDS = 120


@dataclass
class LlamaEditResult:
    """llama-server's answer to the edit request, with its speculative mode; `not_run` says why it was not."""

    spec_type: str
    counts: list[int] = field(default_factory=list)  # completion tokens of each run
    seconds: list[float] = field(default_factory=list)  # per run, first to last streamed token
    text: str = ""  # the last run's answer
    prompt_tokens: int = 0
    not_run: str = ""

    @property
    def best(self) -> float:
        return max((rate(n, s) for n, s in zip(self.counts, self.seconds, strict=True)), default=0.0)


def llama_server_help(exe: Path) -> str:
    try:
        shown = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=30)
        return shown.stdout + shown.stderr
    except (OSError, subprocess.SubprocessError):
        return ""


def spec_types(helptext: str) -> list[str]:
    """The values `--spec-type` takes in this build (its --help line: `--spec-type none,ngram-simple,...`)."""
    for line in helptext.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "--spec-type":
            return words[1].split(",")
    return []


def llama_server_command(
    exe: Path, model: Path, helptext: str, *, threads: int, n_ctx: int, port: int, spec_type: str, gpu: bool = False
) -> list[str]:
    """llama-server on the CPU (-ngl 0, no device) or the GPU (-ngl 99), one slot, flash attention on,
    as llama-bench runs."""
    ngl = 99 if gpu else 0
    flags = f"-t {threads} -c {n_ctx} -np 1 -ngl {ngl} -fa on --host 127.0.0.1 --port {port} --spec-type {spec_type}"
    cmd = [str(exe), "-m", str(model), *flags.split()]
    cmd += ["-dev", "none"] if "--device" in helptext and not gpu else []
    return cmd + (["--no-webui"] if "--no-webui" in helptext else [])


def run_llama_edit(
    exe: Path | None, model: Path, *, threads: int, repetitions: int, n_edit: int, spec_type: str = LLAMA_SPEC_DEFAULT,
    gpu: bool = False,
) -> LlamaEditResult:
    """The edit request to llama-server `repetitions` times, a fresh server each run (so no run drafts from
    an earlier answer, as Kinetic's runs do not); a missing server or mode, or a failure, is `not_run`."""
    result = LlamaEditResult(spec_type)
    if exe is None:
        result.not_run = "llama-server not found (beside llama-bench, on PATH or in the usual folders)"
        return result
    helptext = llama_server_help(exe)
    known = spec_types(helptext)
    if spec_type not in known:
        result.not_run = (
            f"{exe} has no --spec-type {spec_type}" if known else f"{exe} has no --spec-type (too old a build)"
        )
        return result
    try:
        for _ in range(repetitions):
            cmd = llama_server_command(
                exe, model, helptext, threads=threads, n_ctx=1024 + n_edit, port=_free_port(), spec_type=spec_type,
                gpu=gpu,
            )
            with llama_server(cmd) as url:
                text, count, seconds, result.prompt_tokens = stream_edit(url, n_edit)
            result.text = text
            result.counts.append(count)
            result.seconds.append(seconds)
    except KineticError as exc:
        result.not_run = f"llama-server failed: {exc.message}"
    return result


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_server(cmd: list[str]):
    """Start llama-server, wait until /health answers 200, yield its URL; always stop it afterwards
    (also on an error or Ctrl-C)."""
    import tempfile
    import urllib.error
    import urllib.request

    url = f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}"
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + SERVER_START_SECONDS
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    tail = (log.read().strip().splitlines() or ["no message"])[-1]
                    raise KineticError(f"exit {proc.returncode}: {tail}", f"Run it by hand: {' '.join(cmd)}")
                try:
                    with urllib.request.urlopen(url + "/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, OSError):
                    pass
                if time.monotonic() > deadline:
                    raise KineticError(f"not ready after {SERVER_START_SECONDS} s", f"Run it by hand: {' '.join(cmd)}")
                time.sleep(0.1)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def stream_edit(url: str, n_edit: int) -> tuple[str, int, float, int]:
    """The edit request, greedy and streamed, to an OpenAI chat endpoint: (answer, completion tokens,
    seconds from the first streamed token to the last, prompt tokens). The clock ticks on each chunk
    that carries text or the finish (the end-of-turn token, which Kinetic's count includes too)."""
    import urllib.error
    import urllib.request

    body = {
        "messages": [{"role": "user", "content": EDIT_REQUEST}],
        "temperature": 0,
        "max_tokens": n_edit,
        "stream": True,
        "stream_options": {"include_usage": True},
        "cache_prompt": False,
    }
    request = urllib.request.Request(
        url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    parts, usage, clock = [], {}, FirstToLast()
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            for raw in response:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                for choice in chunk.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content")
                    if text or choice.get("finish_reason"):
                        clock.tick()
                    parts.append(text or "")
                usage = chunk.get("usage") or usage
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise KineticError(f"the edit request failed: {exc}", "Check the server's log by running it by hand.") from None
    return "".join(parts), int(usage.get("completion_tokens", 0)), clock.seconds, int(usage.get("prompt_tokens", 0))
