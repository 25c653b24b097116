"""`kinetic bench`: llama-bench's two tests and the edit test on Kinetic's engine.

Owns: timing pp<N> (one prompt of N tokens), tg<N> (N greedy decode steps) and the edit test (a
greedy chat answer that repeats its prompt, drafted and plain) on a loaded model, and the table and
JSON that report them. llama.cpp's side of `--compare` (its llama-bench, its edit test through
llama-server, the card) is kinetic.bench_llama's. It does not own the engine (it calls
`new_sequence`, `prefill` and `decode` as any user would) nor the command line (kinetic.cli.bench_cmd).

Each test runs on a fresh sequence, after one untimed warm-up that loads the compiled kernels, and is
repeated; the best run is the reported number, as llama.cpp's best run is on the card.
"""

from __future__ import annotations

import gc
import os
import resource
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kinetic import __version__
from kinetic.devices import DEVICE_NAMES, DEVICES, resolve_device
from kinetic.errors import KineticError

# Speed technologies `--off` can name; RAD-1 and Shortlist are built: --off rad1 turns drafting off,
# --off shortlist makes every decode step score the whole output layer.
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
    shortlist_share: float | None = None  # tg's rows of the output layer scored exactly, per token (None: off)
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

    device = resolve_device(device)  # auto: CUDA, a Vulkan GPU, else the CPU (a line per device skipped)
    start = time.perf_counter()
    draft = "rad1" not in (off or [])
    model = Model(
        model_spec, n_ctx=max(n_prompt, n_gen, 1024 + n_edit) + 1, device=device, threads=threads, draft=draft,
        shortlist="shortlist" not in (off or []),
    )
    load_seconds = time.perf_counter() - start
    engine = model.engine
    # None: a .ktc profile's threads, else every CPU; the table shows the count that ran
    threads = getattr(engine.runner, "threads", None) or threads or os.cpu_count() or 1
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
        head = getattr(engine, "head", None)
        before = (head.calls, head.scored) if head else None
        result.tests.append(
            TestResult(f"tg{n_gen}", n_gen, [_time_generate(engine, first, n_gen) for _ in range(repetitions)])
        )
        if head and head.calls > before[0]:
            result.shortlist_share = (head.scored - before[1]) / (head.calls - before[0]) / head.n
    if n_edit > 0:
        result.edit = run_edit(model, n_edit, repetitions, draft)
    result.peak_rss_bytes = peak_rss_bytes()
    return result


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


def _time_generate(engine, first: int, n_gen: int) -> float:
    """n_gen decode steps after one untimed token, each feeding back the likeliest token (greedy: with
    Shortlist on, only the output layer's rows that can be the likeliest are scored)."""
    seq = engine.new_sequence()
    logits = engine.prefill(seq, [first], top=1)
    gc.collect()
    start = time.perf_counter()
    for _ in range(n_gen):
        logits = engine.decode(seq, int(np.argmax(logits)), top=1)
    return time.perf_counter() - start


def edit_prompt(model) -> list[int]:
    """The edit request through the model's chat template, as `kinetic run` and the server build it."""
    text = model.apply_chat_template([{"role": "user", "content": EDIT_REQUEST}], add_generation_prompt=True)
    return model.tokenize(text, add_special=True, parse_special=True)


def run_edit(model, n_edit: int, repetitions: int, draft: bool) -> EditResult:
    """The edit test, greedy: `repetitions` runs with RAD-1 (plain with --off rad1), then as many plain.

    Each run gets a fresh decoder with an empty index of seen requests, so no run can draft from an
    earlier run's answer: every run is a first request. Pass costs are shared (they describe the machine);
    one untimed run first warms the drafted passes' code, as pp and tg have their warm-up.
    """
    from kinetic.runtime.drafting import PassCosts

    prompt, costs = edit_prompt(model), PassCosts()
    _time_edit(model, prompt, min(n_edit, 32), draft, costs)  # untimed: warms the drafted passes' code
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
    """`on: RAD-1, Shortlist` (JSON's technologies), without those --off names, `on: none` without both."""
    on = [name for key, name in (("rad1", "RAD-1"), ("shortlist", "Shortlist")) if key not in off]
    return f"on: {', '.join(on) or 'none'}"


def technologies_line(off: list[str]) -> str:
    told = f" (--off {','.join(off)})" if off else ""
    return (
        f"speed technologies {technologies_on(off)}{told}; Torque is not built yet"
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
    backend = DEVICES[r.device].backend
    cells = f"| {r.path.stem} | {_gib(r.size_bytes)} | {r.parameters / 1e9:.2f} B | {backend} | {r.threads}"
    rows = [f"{cells} | {t.name} | {t.best:.2f} |" for t in r.tests]
    rows.append(f"{cells} | {edit_name(r)} | {f'{r.edit.best:.2f}' if r.edit else 'not measured'} |")
    notes = [
        f"on {DEVICE_NAMES[r.device]}, {r.threads} threads, best of {r.repetitions}, load {r.load_seconds:.2f} s",
        technologies_line(r.off),
        edit_line(r.edit) if r.edit else f"edit: {EDIT_SKIPPED}",
        f"peak memory {_gib(r.peak_rss_bytes)}",
    ]
    if r.shortlist_share is not None:
        share = 100 * r.shortlist_share
        notes.append(f"shortlist: {share:.2f} % of the output layer's rows scored exactly per tg token")
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
        "shortlist_share": r.shortlist_share,
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
