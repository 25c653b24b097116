"""`kinetic bench`: llama-bench's two tests on Kinetic's engine, and the card against llama.cpp.

Owns: timing pp<N> (one prompt of N tokens) and tg<N> (N greedy decode steps) on a loaded model,
the table and JSON that report them, finding and running llama.cpp's own llama-bench on the same
file (never downloading it) and the comparison card. It does not own the engine (it calls
`new_sequence`, `prefill` and `decode` as any user would) nor the command line (kinetic.cli.bench_cmd).

Each test runs on a fresh sequence, after one untimed warm-up that loads the compiled kernels, and is
repeated; the best run is the reported number, as llama.cpp's best run is on the card.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kinetic import __version__
from kinetic.errors import KineticError

# Speed technologies `--off` can name; of them only RAD-1 is built: --off rad1 turns drafting off.
OFF_NAMES = ("rad1", "shortlist", "torque", "warm-start")
EDIT_TOKENS = 256
EDIT_SKIPPED = "not measured: skipped"
# The edit test's request (docs/benchmarks.md): rename one variable, send the whole file back.
EDIT_FILE = """\
def summarize(orders):
    total = 0
    count = 0
    for order in orders:
        if order.status == "paid":
            total += order.amount
            count += 1
    average = total / count if count else 0.0
    return {"total": total, "count": count, "average": average}


def report(orders):
    summary = summarize(orders)
    lines = [f"orders: {summary['count']}", f"total: {summary['total']:.2f}"]
    lines.append(f"average: {summary['average']:.2f}")
    return "\\n".join(lines)
"""
EDIT_REQUEST = (
    "Rename the variable `total` to `paid_total` in this Python file. Reply with the whole file, "
    "changed, and nothing else.\n\n```python\n" + EDIT_FILE + "```"
)
DEVICE_NAMES = {"cpu": "the CPU", "reference": "the CPU (reference interpreter)"}
BACKENDS = {"cpu": "CPU", "reference": "CPU (reference)"}
TOKEN_SEED = 0  # prompt tokens are random ids, as llama-bench's are, but the same on every run

# Where --compare looks for llama-bench after PATH (Kinetic never downloads it).
LLAMA_BENCH_PLACES = (
    Path.home() / ".cache/kinetic-ref/llama.cpp/build/bin/llama-bench",
    Path("/usr/local/bin/llama-bench"),
)


@dataclass
class TestResult:
    """One test (pp512 or tg128): tokens per run and the seconds of each timed run."""

    name: str
    tokens: int
    seconds: list[float]

    @property
    def rates(self) -> list[float]:
        return [self.tokens / s for s in self.seconds]

    @property
    def best(self) -> float:
        return max(self.rates)

    def to_json(self) -> dict:
        rates = self.rates
        return {
            "name": self.name,
            "tokens": self.tokens,
            "t_s": round(self.best, 2),
            "mean": round(statistics.fmean(rates), 2),
            "stddev": round(statistics.stdev(rates), 2) if len(rates) > 1 else 0.0,
            "runs": [round(r, 2) for r in rates],
        }


@dataclass
class EditResult:
    """The edit test: its tokens drafted (RAD-1, unless --off rad1) and plain, and the best speeds."""

    limit: int
    drafted: bool  # RAD-1 ran (not --off rad1)
    tokens: list[int]  # the drafted run's answer, as the decoder yields it (the end-of-turn token included)
    plain_tokens: list[int]
    seconds: list[float]  # per run, first to last token
    plain_seconds: list[float]
    guessed: int = 0  # RAD-1's guessed rows and the guesses kept, in the last drafted run
    kept: int = 0
    text: str = ""  # the drafted answer, without the end-of-turn token (to compare with llama-server's)
    prompt_tokens: int = 0

    @property
    def identical(self) -> bool:
        return self.tokens == self.plain_tokens

    @property
    def best(self) -> float:
        return _rate(len(self.tokens), min(self.seconds))

    @property
    def plain_best(self) -> float:
        return _rate(len(self.plain_tokens), min(self.plain_seconds))


def _rate(n_tokens: int, seconds: float) -> float:
    """Tokens after the first over the time from the first to the last (the first comes with the prompt)."""
    return (n_tokens - 1) / seconds if n_tokens > 1 and seconds > 0 else 0.0


@dataclass
class BenchResult:
    path: Path
    device: str
    threads: int
    repetitions: int
    off: list[str]
    load_seconds: float
    size_bytes: int
    parameters: int
    weight_type: str  # the type holding most of the file's bytes, e.g. Q4_1
    peak_rss_bytes: int
    tests: list[TestResult] = field(default_factory=list)
    edit: EditResult | None = None

    def test(self, prefix: str) -> TestResult | None:
        return next((t for t in self.tests if t.name.startswith(prefix)), None)


def parse_off(text: str | None) -> list[str]:
    """`rad1,torque` -> ["rad1", "torque"]; an unknown name is a KineticError listing the known ones."""
    names = [n.strip().lower() for n in (text or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in OFF_NAMES]
    if unknown:
        raise KineticError(
            f"--off: unknown speed technology {unknown[0]!r}",
            f"Name one or more of {', '.join(OFF_NAMES)}, separated by commas.",
        )
    return list(dict.fromkeys(names))


def run_bench(
    model_spec: str | os.PathLike,
    *,
    threads: int | None,
    repetitions: int,
    device: str = "cpu",
    off: list[str] | None = None,
    n_prompt: int = 512,
    n_gen: int = 128,
    n_edit: int = EDIT_TOKENS,
) -> BenchResult:
    """Load the model, then time pp<n_prompt>, tg<n_gen> and the edit test (at most n_edit tokens)
    `repetitions` times each (0 skips a test)."""
    from kinetic.model import Model

    device = "cpu" if device == "auto" else device
    start = time.perf_counter()
    draft = "rad1" not in (off or [])
    model = Model(
        model_spec, n_ctx=max(n_prompt, n_gen, 1024 + n_edit) + 1, device=device, threads=threads, draft=draft
    )
    load_seconds = time.perf_counter() - start
    engine = model.engine
    # None: a .ktc profile's threads, else every CPU; the table shows the count that ran
    threads = getattr(engine.interpreter, "threads", None) or threads or os.cpu_count() or 1
    prompt = [int(t) for t in np.random.default_rng(TOKEN_SEED).integers(0, engine.n_vocab, max(n_prompt, 1))]
    _warm_up(engine, prompt[: min(len(prompt), getattr(engine, "batch", 64))], n_gen)
    result = BenchResult(
        path=model.path,
        device=device,
        threads=threads,
        repetitions=repetitions,
        off=list(off or []),
        load_seconds=load_seconds,
        size_bytes=model.path.stat().st_size,
        parameters=sum(t.n_elements for t in model.gguf.tensors.values()),
        weight_type=_main_weight_type(model.gguf),
        peak_rss_bytes=0,
    )
    if n_prompt > 0:
        result.tests.append(
            TestResult(f"pp{n_prompt}", n_prompt, [_time_prompt(engine, prompt) for _ in range(repetitions)])
        )
    if n_gen > 0:
        first = _first_token(model.gguf.metadata, prompt[0])
        result.tests.append(
            TestResult(f"tg{n_gen}", n_gen, [_time_generate(engine, first, n_gen) for _ in range(repetitions)])
        )
    if n_edit > 0:
        result.edit = run_edit(model, n_edit, repetitions, draft)
    result.peak_rss_bytes = peak_rss_bytes()
    return result


def _warm_up(engine, tokens: list[int], n_gen: int) -> None:
    """One untimed prompt chunk and decode step, so kernel compilation or cache loads are not timed."""
    seq = engine.new_sequence()
    logits = engine.prefill(seq, tokens)
    if n_gen > 0:
        engine.decode(seq, int(np.argmax(logits)))


def _time_prompt(engine, tokens: list[int]) -> float:
    seq = engine.new_sequence()
    gc.collect()
    start = time.perf_counter()
    engine.prefill(seq, tokens)
    return time.perf_counter() - start


def _time_generate(engine, first: int, n_gen: int) -> float:
    """n_gen decode steps after one untimed token, each feeding back the likeliest token."""
    seq = engine.new_sequence()
    logits = engine.prefill(seq, [first])
    gc.collect()
    start = time.perf_counter()
    for _ in range(n_gen):
        logits = engine.decode(seq, int(np.argmax(logits)))
    return time.perf_counter() - start


def edit_prompt(model) -> list[int]:
    """The edit request through the model's chat template, as `kinetic run` and the server build it."""
    text = model.apply_chat_template([{"role": "user", "content": EDIT_REQUEST}], add_generation_prompt=True)
    return model.tokenize(text, add_special=True, parse_special=True)


def run_edit(model, n_edit: int, repetitions: int, draft: bool) -> EditResult:
    """The edit test, greedy: `repetitions` runs with RAD-1 (plain with --off rad1), then as many plain.

    Each run gets a fresh decoder with an empty index of seen requests, so no run can draft from an
    earlier run's answer: every run is a first request. Pass costs are shared (they describe the machine).
    """
    from kinetic.runtime.drafting import PassCosts

    prompt, costs = edit_prompt(model), PassCosts()
    drafted = [_time_edit(model, prompt, n_edit, draft, costs) for _ in range(repetitions)]
    plain = [_time_edit(model, prompt, n_edit, False, costs) for _ in range(repetitions)]
    tokens, _, stats = drafted[-1]
    eot = set(model.tokenizer.eot_ids)
    text = model.detokenize([t for t in tokens if t not in eot])
    return EditResult(
        n_edit,
        draft,
        tokens,
        plain[-1][0],
        [d[1] for d in drafted],
        [p[1] for p in plain],
        stats.drafted,
        stats.accepted,
        text,
        len(prompt),
    )


def _time_edit(model, prompt: list[int], n_edit: int, draft: bool, costs):
    """One greedy answer through SpeculativeDecoder: (its tokens, seconds from first to last, stats)."""
    from kinetic.runtime.drafting import SEEN_BUDGET, SEEN_ORDERS, SEEN_SLOT_BITS, NgramIndex
    from kinetic.runtime.speculative import SpeculativeDecoder

    seen = NgramIndex(SEEN_BUDGET, SEEN_ORDERS, SEEN_SLOT_BITS)
    decoder = SpeculativeDecoder(model.engine, draft=draft, seen=seen, costs=costs)
    stop = set(model.tokenizer.eot_ids)
    tokens, clock = [], FirstToLast()
    gc.collect()
    for token in decoder.generate(model.engine.new_sequence(), prompt, n_edit, stop=stop):
        clock.tick()
        tokens.append(token)
    return tokens, clock.seconds, decoder.stats


class FirstToLast:
    """The edit test's clock, the same for Kinetic and llama-server: `tick()` as each token arrives
    (Kinetic: as the decoder yields it; llama-server: as its streamed chunk is read); `seconds` is the
    time from the first arrival to the last. The first token comes with the prompt, so speed is
    (tokens - 1) / seconds (`_rate`)."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last = 0.0

    def tick(self) -> None:
        self.last = time.perf_counter()
        if self.first is None:
            self.first = self.last

    @property
    def seconds(self) -> float:
        return self.last - self.first if self.first is not None else 0.0


def _first_token(metadata: dict, fallback: int) -> int:
    """BOS when the model adds one (as llama-bench starts tg), else a fixed token."""
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    return int(bos) if bos is not None and metadata.get("tokenizer.ggml.add_bos_token") else fallback


def _main_weight_type(gguf) -> str:
    nbytes: Counter[str] = Counter()
    for info in gguf.tensors.values():
        nbytes[info.type.name] += info.nbytes
    return nbytes.most_common(1)[0][0] if nbytes else "unknown"


def peak_rss_bytes() -> int:
    """This process's peak resident memory (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


# -- Kinetic's report ---------------------------------------------------------------------------------


def technologies_on(off: list[str]) -> str:
    """`on: RAD-1` (JSON's technologies), `on: none` with --off rad1."""
    return "on: none" if "rad1" in off else "on: RAD-1"


def technologies_line(off: list[str]) -> str:
    told = f" (--off {','.join(off)})" if off else ""
    return (
        f"speed technologies {technologies_on(off)}{told}; Shortlist and Torque are not built yet"
        "; Warm Start, Zero Wait and Convoy take no part"
    )


def edit_line(e: EditResult) -> str:
    """The line under the table; NO means a bug (bench exits 1)."""
    return f"edit: drafted output identical to plain decoding: {'yes' if e.identical else 'NO'}"


def edit_name(r: BenchResult) -> str:
    return f"edit{r.edit.limit}" if r.edit else f"edit{EDIT_TOKENS}"


def table(r: BenchResult) -> str:
    """llama-bench's markdown table, then the lines that say how it was measured."""
    head = [
        "| model | size | params | backend | threads | test | t/s |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    cells = f"| {r.path.stem} | {_gib(r.size_bytes)} | {r.parameters / 1e9:.2f} B | {BACKENDS[r.device]} | {r.threads}"
    rows = [f"{cells} | {t.name} | {t.best:.2f} |" for t in r.tests]
    rows.append(f"{cells} | {edit_name(r)} | {f'{r.edit.best:.2f}' if r.edit else 'not measured'} |")
    notes = [
        f"on {DEVICE_NAMES[r.device]}, {r.threads} threads, best of {r.repetitions}, load {r.load_seconds:.2f} s",
        technologies_line(r.off),
        edit_line(r.edit) if r.edit else f"edit: {EDIT_SKIPPED}",
        f"peak memory {_gib(r.peak_rss_bytes)}",
    ]
    return "\n".join(head + rows + [""] + notes)


def to_json(r: BenchResult) -> dict:
    pp, tg = r.test("pp"), r.test("tg")
    return {
        "model": r.path.name,
        "backend": "cpu",
        "device": DEVICE_NAMES[r.device],
        "threads": r.threads,
        "repetitions": r.repetitions,
        "load_seconds": round(r.load_seconds, 4),
        "size_bytes": r.size_bytes,
        "parameters": r.parameters,
        "prefill_tokens": pp.tokens if pp else 0,
        "prefill_tokens_per_second": round(pp.best, 2) if pp else None,
        "decode_tokens": tg.tokens if tg else 0,
        "decode_tokens_per_second": round(tg.best, 2) if tg else None,
        "tests": [t.to_json() for t in r.tests],
        **edit_json(r.edit),
        "technologies": technologies_on(r.off),
        "off": r.off,
        "peak_rss_bytes": r.peak_rss_bytes,
        "kinetic_version": __version__,
    }


def edit_json(e: EditResult | None) -> dict:
    if e is None:
        return {"edit_tokens": 0, "edit_tokens_per_second": None, "edit_identical": None}
    return {
        "edit_tokens": len(e.tokens),
        "edit_tokens_per_second": round(e.best, 2),
        "edit_identical": e.identical,
        "edit_limit": e.limit,
        "edit_drafted": e.drafted,
        "edit_plain_tokens_per_second": round(e.plain_best, 2),
        "edit_guessed": e.guessed,
        "edit_kept": e.kept,
    }


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB"


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
    exe: Path, model: Path, *, threads: int, repetitions: int, n_prompt: int, n_gen: int
) -> list[str]:
    """llama-bench on the CPU with flash attention on, spelling flags as this build's --help does."""
    try:
        shown = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=30)
        helptext = shown.stdout + shown.stderr
    except (OSError, subprocess.SubprocessError):
        helptext = ""
    flash = "on" if "<on|off|auto>" in helptext else "1"
    flags = f"-t {threads} -r {repetitions} -p {n_prompt} -n {n_gen} -fa {flash} -ngl 0 -o json"
    cmd = [str(exe), "-m", str(model), *flags.split()]
    if "--device" in helptext:
        cmd += ["-dev", "none"]
    return cmd


def run_llama_bench(
    exe: Path, model: Path, *, threads: int, repetitions: int, n_prompt: int = 512, n_gen: int = 128
) -> LlamaBenchResult:
    cmd = llama_bench_command(exe, model, threads=threads, repetitions=repetitions, n_prompt=n_prompt, n_gen=n_gen)
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
    exe: Path, model: Path, helptext: str, *, threads: int, n_ctx: int, port: int, spec_type: str
) -> list[str]:
    """llama-server on the CPU (-ngl 0, no device), one slot, flash attention on, as llama-bench runs."""
    flags = f"-t {threads} -c {n_ctx} -np 1 -ngl 0 -fa on --host 127.0.0.1 --port {port} --spec-type {spec_type}"
    cmd = [str(exe), "-m", str(model), *flags.split()]
    cmd += ["-dev", "none"] if "--device" in helptext else []
    return cmd + (["--no-webui"] if "--no-webui" in helptext else [])


def run_llama_edit(
    exe: Path | None, model: Path, *, threads: int, repetitions: int, n_edit: int, spec_type: str = LLAMA_SPEC_DEFAULT
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
                exe, model, helptext, threads=threads, n_ctx=1024 + n_edit, port=_free_port(), spec_type=spec_type
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
    import socket

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
    """The seed's edit line: the request, llama.cpp's speculative mode, and whether the answers agree."""
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
