"""`kinetic bench`: llama-bench's two tests and the edit test on Kinetic's engine.

Owns: the `--off` names (`parse_off`), loading the model, timing pp<N> (one prompt of N tokens) and
tg<N> (N greedy decode steps) on it, and running the edit test (kinetic.bench_edit) after them, into
one `BenchResult`. It does not own the reports (kinetic.bench_report: table and JSON), llama.cpp's
side of `--compare` (kinetic.bench_llama, bench_llama_edit, bench_card), the engine (it calls
`new_sequence`, `prefill` and `decode` as any user would) nor the command line (kinetic.cli.bench_cmd).

A `BenchSession` loads the model once and times rounds: each round one pp run and one tg run, so
`--compare` can put llama.cpp's rounds between Kinetic's (the engines take turns under the same
load). Each test runs on a fresh sequence, after one untimed warm-up that loads the compiled
kernels; the best run is the reported number, as llama.cpp's best run is on the card. After the
rounds come the edit test and, on the CPU, the bytes a decode step read (`DecodeTraffic`) and the
machine's read bandwidth (kinetic.bench_bandwidth).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kinetic.bench_bandwidth import (
    DecodeTraffic,
    ReadBandwidth,
    ShortlistTraffic,
    mean_entries_attended,
    read_bandwidth,
)
from kinetic.bench_edit import EDIT_TOKENS, EditResult, run_edit
from kinetic.bench_file_type import file_type_name
from kinetic.devices import resolve_device
from kinetic.errors import KineticError

# Speed technologies `--off` can name; RAD-1 and Shortlist are built: --off rad1 turns drafting off,
# --off shortlist makes every decode step score the whole output layer.
OFF_NAMES = ("rad1", "shortlist", "torque", "warm-start")
TOKEN_SEED = 0  # prompt tokens are random ids, as llama-bench's are, but the same on every run


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
class BenchResult:
    path: Path
    device: str
    threads: int
    repetitions: int
    off: list[str]
    load_seconds: float
    size_bytes: int
    parameters: int
    file_type: str  # llama.cpp's name for the file's type (kinetic.bench_file_type), e.g. Q4_K - Medium
    peak_rss_bytes: int
    shortlist_share: float | None = None  # tg's rows of the output layer scored exactly, per token (None: off)
    tests: list[TestResult] = field(default_factory=list)
    edit: EditResult | None = None
    traffic: DecodeTraffic | None = None  # bytes a timed decode step read (None: no tg test)
    read_bandwidth: float | None = None  # the machine's, bytes/s at these threads (None: not on the CPU)
    read_bandwidth_passes: ReadBandwidth | None = None  # every pass of that measurement (its spread)
    numerics: str = "ggml"  # the numerics mode the model ran in (kinetic/ir/orders.py; --numerics)

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
    numerics: str | None = None,
) -> BenchResult:
    """Load the model, then time pp<n_prompt>, tg<n_gen> (`repetitions` rounds of one run each) and
    the edit test (at most n_edit tokens, `repetitions` times); 0 skips a test. `numerics`: the
    numerics mode (None: the model's default, kinetic/numerics_mode.py)."""
    session = BenchSession(model_spec, threads=threads, repetitions=repetitions, device=device, off=off,
                           n_prompt=n_prompt, n_gen=n_gen, n_edit=n_edit, numerics=numerics)
    for _ in range(repetitions):
        session.time_round()
    return session.finish()


class BenchSession:
    """A loaded, warmed-up model: `time_round()` times one pp and one tg run, `finish()` runs the
    edit test and completes the result."""

    def __init__(
        self, model_spec: str | os.PathLike, *, threads: int | None, repetitions: int, device: str = "cpu",
        off: list[str] | None = None, n_prompt: int = 512, n_gen: int = 128, n_edit: int = EDIT_TOKENS,
        numerics: str | None = None,
    ):
        from kinetic.frontend.blocks import Options
        from kinetic.model import Model

        device = resolve_device(device)  # auto: CUDA, a Vulkan GPU, else the CPU (a line per device skipped)
        start = time.perf_counter()
        self.draft = "rad1" not in (off or [])
        self.model = Model(
            model_spec, n_ctx=max(n_prompt, n_gen, 1024 + n_edit) + 1, device=device, threads=threads,
            draft=self.draft, shortlist="shortlist" not in (off or []),
            options=Options(numerics=numerics) if numerics else None,
        )
        load_seconds = time.perf_counter() - start
        self.engine = engine = self.model.engine
        # None: a .ktc profile's threads, else every CPU; the table shows the count that ran
        threads = getattr(engine.runner, "threads", None) or threads or os.cpu_count() or 1
        self.prompt = [int(t) for t in np.random.default_rng(TOKEN_SEED).integers(0, engine.n_vocab, max(n_prompt, 1))]
        _warm_up(engine, self.prompt[: min(len(self.prompt), getattr(engine, "batch", 64))], n_gen)
        self.n_prompt, self.n_gen, self.n_edit = n_prompt, n_gen, n_edit
        self.first = _first_token(self.model.gguf.metadata, self.prompt[0])
        self.shortlisted = ShortlistCount()
        self.result = BenchResult(
            path=self.model.path, device=device, threads=threads, repetitions=repetitions, off=list(off or []),
            load_seconds=load_seconds, size_bytes=self.model.path.stat().st_size,
            parameters=sum(t.n_elements for t in self.model.gguf.tensors.values()),
            file_type=file_type_name(self.model.gguf.metadata, self.model.gguf.tensors), peak_rss_bytes=0,
            numerics=self.model.options.numerics,
        )
        if n_prompt > 0:
            self.result.tests.append(TestResult(f"pp{n_prompt}", n_prompt, []))
        if n_gen > 0:
            self.result.tests.append(TestResult(f"tg{n_gen}", n_gen, []))

    def time_round(self) -> None:
        """One timed run of each test (pp, then tg)."""
        if self.n_prompt > 0:
            self.result.test("pp").seconds.append(_time_prompt(self.engine, self.prompt))
        if self.n_gen > 0:
            self.result.test("tg").seconds.append(
                _time_generate(self.engine, self.first, self.n_gen, self.shortlisted))

    def finish(self) -> BenchResult:
        r = self.result
        head = getattr(self.engine, "head", None)
        if head is not None and self.shortlisted.calls:
            r.shortlist_share = self.shortlisted.scored / self.shortlisted.calls / head.n
        if self.n_edit > 0:
            r.edit = run_edit(self.model, self.n_edit, r.repetitions, self.draft)
        r.peak_rss_bytes = peak_rss_bytes()  # before the bandwidth's buffer raises it
        if self.n_gen > 0 and r.test("tg").seconds:
            r.traffic = decode_traffic(self.model, self.n_gen, self.shortlisted)
            if r.device == "cpu":
                r.read_bandwidth_passes = read_bandwidth(r.threads)
                r.read_bandwidth = r.read_bandwidth_passes.best
        return r


@dataclass
class ShortlistCount:
    """Timed decode steps, and of them those Shortlist served (`calls`) and the rows they scored exactly."""

    steps: int = 0
    calls: int = 0
    scored: int = 0


def decode_traffic(model, n_gen: int, counted: ShortlistCount) -> DecodeTraffic:
    """The bytes a timed tg step read: the file's weights (the output layer as Shortlist read it, one
    row of an untied embedding table) and the f16/f32 KV cache entries attended to."""
    engine, tensors = model.engine, model.gguf.tensors
    total = sum(t.nbytes for t in tensors.values())
    embedding = tensors.get("token_embd.weight")
    output = tensors.get("output.weight") or embedding
    untied = embedding is not None and output is not embedding
    row = embedding.nbytes // engine.n_vocab if untied else 0
    output_bytes = output.nbytes if output is not None else 0
    head = getattr(engine, "head", None)
    shortlist = None
    if head is not None and head.copy is not None and counted.steps:
        shortlist = ShortlistTraffic(
            steps=counted.steps, shortlisted=counted.calls, rows_scored=counted.scored,
            row_bytes=head.raw.shape[1], copy_bytes=_array_bytes(head.copy),
        )
    return DecodeTraffic(
        weight_bytes=total - output_bytes - (embedding.nbytes if untied else 0),
        output_bytes=output_bytes,
        embedding_row_bytes=row,
        kv_bytes_per_entry=2 * sum(engine.kv_width.values()) * np.dtype(engine.kv_dtype).itemsize,
        mean_entries=mean_entries_attended(n_gen),
        shortlist=shortlist,
    )


def _array_bytes(copy) -> int:
    """Bytes of Shortlist's copy: an array, or a record of arrays (its rows, scales and bounds, each
    read whole by a shortlisted step)."""
    if isinstance(copy, np.ndarray):
        return copy.nbytes
    parts = [getattr(copy, f.name) for f in dataclasses.fields(copy)] if dataclasses.is_dataclass(copy) else []
    return sum(part.nbytes for part in parts if isinstance(part, np.ndarray))


def _warm_up(engine, tokens: list[int], n_gen: int) -> None:
    """One untimed prompt chunk and decode step, so kernel compilation or cache loads are not timed."""
    seq = engine.new_sequence()
    logits = engine.prefill(seq, tokens)
    if n_gen > 0:
        engine.decode(seq, int(np.argmax(logits)), top=1)


def _time_prompt(engine, tokens: list[int]) -> float:
    seq = engine.new_sequence()
    gc.collect()
    start = time.perf_counter()
    engine.prefill(seq, tokens)
    return time.perf_counter() - start


def _time_generate(engine, first: int, n_gen: int, counted: ShortlistCount) -> float:
    """n_gen decode steps after one untimed token, each feeding back the likeliest token (greedy: with
    Shortlist on, only the output layer's rows that can be the likeliest are scored); `counted` gains
    the steps and what Shortlist did in them."""
    seq = engine.new_sequence()
    logits = engine.prefill(seq, [first], top=1)
    head = getattr(engine, "head", None)
    before = (head.calls, head.scored) if head else (0, 0)
    gc.collect()
    start = time.perf_counter()
    for _ in range(n_gen):
        logits = engine.decode(seq, int(np.argmax(logits)), top=1)
    seconds = time.perf_counter() - start
    counted.steps += n_gen
    if head:
        counted.calls += head.calls - before[0]
        counted.scored += head.scored - before[1]
    return seconds


def _first_token(metadata: dict, fallback: int) -> int:
    """BOS when the model adds one (as llama-bench starts tg), else a fixed token."""
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    return int(bos) if bos is not None and metadata.get("tokenizer.ggml.add_bos_token") else fallback


def peak_rss_bytes() -> int:
    """This process's peak resident memory (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


