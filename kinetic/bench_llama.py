"""`kinetic bench --compare`: llama.cpp's side of the card: its llama-bench on the same file and
threads, its edit test through llama-server with a speculative mode, and the card and JSON that set
them beside Kinetic's numbers.

Owns: finding llama.cpp's programs (never downloading them), running and stopping them, parsing
their output, the comparison card. Kinetic's own tests, timing and table are kinetic.bench's.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from kinetic import __version__
from kinetic.bench import EDIT_REQUEST, EDIT_SKIPPED, BenchResult, FirstToLast, _gib, _rate, edit_name, to_json
from kinetic.errors import KineticError

# Where --compare looks for llama-bench after PATH (Kinetic never downloads it).
LLAMA_BENCH_PLACES = (
    Path.home() / ".cache/kinetic-ref/llama.cpp/build/bin/llama-bench",
    Path("/usr/local/bin/llama-bench"),
)


# -- llama.cpp's llama-bench ------------------------------------------------------------------------


@dataclass
class LlamaBenchResult:
    build_number: int
    build_commit: str
    best: dict[str, float]  # test name (pp512, tg128) -> best sample, t/s
    mean: dict[str, float]

    @property
    def build(self) -> str:
        return f"b{self.build_number} ({self.build_commit})"


def find_llama_bench(given: str | None) -> Path:
    """The llama-bench to run: `given` (a file or the folder holding it), else PATH, else the usual places."""
    if given:
        path = Path(given).expanduser()
        path = path / "llama-bench" if path.is_dir() else path
        if path.is_file() and os.access(path, os.X_OK):
            return path
        if shutil.which(given):
            return Path(shutil.which(given))
        raise KineticError(
            f"--compare: no llama-bench program at {path}",
            "Give the path of llama.cpp's llama-bench (or its folder): --compare PATH.",
        )
    on_path = shutil.which("llama-bench")
    if on_path:
        return Path(on_path)
    for place in LLAMA_BENCH_PLACES:
        if place.is_file() and os.access(place, os.X_OK):
            return place
    looked = ", ".join(["PATH"] + [str(p) for p in LLAMA_BENCH_PLACES])
    raise KineticError(
        f"--compare: llama-bench not found (looked in {looked})",
        "Build llama.cpp and pass its llama-bench: --compare PATH; Kinetic never downloads it.",
    )


def llama_bench_command(
    exe: Path, model: Path, *, threads: int, repetitions: int, n_prompt: int, n_gen: int, gpu: bool = False
) -> list[str]:
    """llama-bench with flash attention on, on the CPU (-ngl 0 -dev none), or with every layer on the
    GPU (-ngl 99) when Kinetic ran on one, spelling flags as this build's --help does."""
    try:
        shown = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=30)
        helptext = shown.stdout + shown.stderr
    except (OSError, subprocess.SubprocessError):
        helptext = ""
    flash = "on" if "<on|off|auto>" in helptext else "1"
    flags = f"-t {threads} -r {repetitions} -p {n_prompt} -n {n_gen} -fa {flash} -ngl {99 if gpu else 0} -o json"
    cmd = [str(exe), "-m", str(model), *flags.split()]
    if "--device" in helptext and not gpu:
        cmd += ["-dev", "none"]
    return cmd


def run_llama_bench(
    exe: Path, model: Path, *, threads: int, repetitions: int, n_prompt: int = 512, n_gen: int = 128,
    gpu: bool = False,
) -> LlamaBenchResult:
    cmd = llama_bench_command(exe, model, threads=threads, repetitions=repetitions, n_prompt=n_prompt, n_gen=n_gen,
                              gpu=gpu)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        hint = "Check that it is llama.cpp's llama-bench."
        raise KineticError(f"--compare: could not start {exe}: {exc}", hint) from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise KineticError(
            f"--compare: llama-bench failed (exit {proc.returncode}): {tail}",
            f"Run it by hand to see why: {' '.join(cmd)}",
        )
    return parse_llama_bench_json(proc.stdout)


def parse_llama_bench_json(text: str) -> LlamaBenchResult:
    """llama-bench -o json: a list of tests with n_prompt, n_gen, samples_ts, avg_ts and the build."""
    try:
        tests = json.loads(text)
        best, mean = {}, {}
        for t in tests:
            name = f"pp{t['n_prompt']}" if t["n_gen"] == 0 else f"tg{t['n_gen']}"
            best[name] = max(t.get("samples_ts") or [t["avg_ts"]])
            mean[name] = t["avg_ts"]
        return LlamaBenchResult(int(tests[0]["build_number"]), str(tests[0]["build_commit"]), best, mean)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise KineticError(
            f"--compare: could not read llama-bench's JSON output ({type(exc).__name__}: {exc})",
            "Check that the program is llama.cpp's llama-bench and supports -o json.",
        ) from None


# -- llama.cpp's edit test, through llama-server ---------------------------------------------------

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
        return max((_rate(n, s) for n, s in zip(self.counts, self.seconds, strict=True)), default=0.0)


def find_llama_server(near: Path | None) -> Path | None:
    """llama-server beside the llama-bench that ran, else on PATH, else in the usual folders."""
    places = [near.parent / "llama-server"] if near else []
    on_path = shutil.which("llama-server")
    places += ([Path(on_path)] if on_path else []) + [p.parent / "llama-server" for p in LLAMA_BENCH_PLACES]
    return next((p for p in places if p.is_file() and os.access(p, os.X_OK)), None)


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


# -- the card -----------------------------------------------------------------------------------------

TEST_LABELS = {"pp": "prompt", "tg": "generate"}


def card_rows(k: BenchResult, ll: LlamaBenchResult, le: LlamaEditResult | None = None) -> list[dict]:
    """One row per test, edit<N> last: Kinetic's best, llama.cpp's best (None: not run) and the ratio."""
    ours = [(t.name, t.best) for t in k.tests] + [(edit_name(k), k.edit.best if k.edit else None)]
    theirs = dict(ll.best)
    if le is not None and not le.not_run and le.counts:
        theirs[edit_name(k)] = le.best
    rows = []
    for name, mine in ours:
        other = theirs.get(name)
        rows.append(
            {
                "test": name,
                "kinetic_t_s": round(mine, 2) if mine is not None else None,
                "llama_cpp_t_s": round(other, 2) if other else None,
                "ratio": round(mine / other, 3) if other and mine else None,
            }
        )
    return rows


def card(k: BenchResult, ll: LlamaBenchResult, le: LlamaEditResult | None = None) -> str:
    """The markdown card of `kinetic bench --compare`; `le` is llama-server's edit test (None: not run)."""
    lines = [
        f"## Kinetic vs llama.cpp: {k.path.stem}",
        "",
        f"| test | Kinetic {__version__} | llama.cpp {ll.build} | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    for row in card_rows(k, ll, le):
        label = f"{TEST_LABELS[row['test'][:2]]} {row['test']}" if row["test"][:2] in TEST_LABELS else row["test"]
        mine = f"{row['kinetic_t_s']:.1f}" if row["kinetic_t_s"] is not None else "not measured"
        theirs = f"{row['llama_cpp_t_s']:.1f}" if row["llama_cpp_t_s"] else "not run"
        ratio = f"{row['ratio']:.2f}x" if row["ratio"] else "-"
        lines.append(f"| {label} | {mine} | {theirs} | {ratio} |")
    lines += [
        "",
        machine_line(),
        f"Same file ({_gib(k.size_bytes)}, {k.weight_type}), on the CPU, {k.threads} threads, "
        f"flash attention on, best of {k.repetitions}, t/s.",
        card_edit_line(k, le),
    ]
    return "\n".join(lines)


def card_edit_line(k: BenchResult, le: LlamaEditResult | None) -> str:
    """The line under the card for edit256: the request, llama.cpp's speculative mode, and whether the
    answers agree (docs/benchmarks.md)."""
    if k.edit is None:
        return f"edit: {EDIT_SKIPPED}; llama.cpp's edit test not run either."
    ours = f"Kinetic's output identical to plain decoding: {'yes' if k.edit.identical else 'NO'}"
    head = f"{edit_name(k)}: greedy copy of a file with one rename"
    if le is None or le.not_run:
        why = le.not_run if le is not None else "not asked for"
        return f"{head}; {ours}; llama.cpp's edit test (llama-server) not run: {why}."
    same = "yes" if le.text == k.edit.text else "no (llama.cpp is not batch-invariant; reported, not a failure)"
    prompts = (
        ""
        if le.prompt_tokens == k.edit.prompt_tokens
        else (f"; prompts differ: {k.edit.prompt_tokens} tokens here, {le.prompt_tokens} there")
    )
    return (
        f"{head}; llama.cpp speculative mode {le.spec_type} (llama-server, streamed, first to last token); "
        f"{ours}; llama.cpp's answer identical to Kinetic's: {same}{prompts}."
    )


def llama_edit_json(k: BenchResult, le: LlamaEditResult | None) -> dict | None:
    if le is None:
        return None
    if le.not_run or not le.counts:
        return {"spec_type": le.spec_type, "not_run": le.not_run or "no runs"}
    return {
        "spec_type": le.spec_type,
        "t_s": round(le.best, 2),
        "runs": [round(_rate(n, s), 2) for n, s in zip(le.counts, le.seconds, strict=True)],
        "tokens": le.counts[-1],
        "prompt_tokens": le.prompt_tokens,
        "identical_to_kinetic": le.text == k.edit.text if k.edit else None,
    }


def card_json(k: BenchResult, ll: LlamaBenchResult, le: LlamaEditResult | None = None) -> dict:
    return {
        "model": k.path.stem,
        "machine": machine_line(),
        "threads": k.threads,
        "repetitions": k.repetitions,
        "kinetic_version": __version__,
        "llama_cpp": {
            "build": ll.build,
            "build_number": ll.build_number,
            "build_commit": ll.build_commit,
            "best_t_s": ll.best,
            "mean_t_s": ll.mean,
            "edit": llama_edit_json(k, le),
        },
        "tests": card_rows(k, ll, le),
        "kinetic": to_json(k),
    }


def machine_line() -> str:
    """`CPU model, OS`, e.g. `AMD EPYC, Debian GNU/Linux 12 (bookworm)`."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        system = platform.freedesktop_os_release()["PRETTY_NAME"]
    except (OSError, KeyError, AttributeError):
        system = f"{platform.system()} {platform.release()}"
    return f"{cpu}, {system}"
