"""`kinetic compile --tune`'s measuring: the engines it builds, the runs it times and its time bound.

Owns: `Candidate` (one setting: Engine's threads, batch, matmul and prompt_pass; and its runs), the
search's engines (`Engines`: built on first use, their logits checked bit for bit against the first
engine's), one timed run (`run`), the run lengths (`calibrate`), what runs and builds cost on the
wall clock (`Walls`) and a phase's rounds (`measure`). Does not own the candidate lists, the phases
and the choices (tune.py) nor the bit check itself (tune_kernels.py).

The bound. A phase starts a build or a run only when SLACK times its estimate ends before the phase's
deadline, and every estimate is of the wall clock, all of it (a run's new sequence and a tg run's
untimed prompt, a build's opening, bit check and kernel compiles):

* a run: the candidate's own longest run of that kind; before it has one, the longest wall per unit
  (a prompt token for pp, a decode step for tg) seen at the fewest threads t >= its count c, times
  t/c, times its units. A pass's work split over c threads instead of t takes at most t/c as long,
  and a unit's wall from a short run bounds a longer run's (a longer prompt pass costs less a token,
  a longer tg run shares its prompt among more steps).
* a build: opening an engine (the longest opening seen, its compiles taken out) + its bit check
  (the longest check seen after the first engine's, scaled as a run; until one is, FRESH x a pp run
  of its tokens and one decode step: a new engine's first passes are slower); for a kernel set no
  engine has, + compiling its kernels, one per (weight type, K) of the graph, each at the longest
  compile seen and at least KERNEL_SECONDS: they may or may not be in the disk cache, which is not
  known beforehand (a new set's kernels compile while it opens and in its first pass).
* a tg run also stops at the deadline between decode steps (a cut run is not counted), so only a
  pp run (one pass) or a build can end past the deadline, by what it takes beyond SLACK x its estimate.

Not bounded: the first engine (the default, built before anything is measured; its kernels compile
when they are not on disk) and the calibration's two shortest runs. A limit shorter than they take
ends the search after them.
"""

from __future__ import annotations

import gc
import itertools
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from kinetic.codegen.cpu.jit import default_jit
from kinetic.codegen.cpu.matmul_choice import MatmulChoice, graph_weights
from kinetic.ktc.tune_kernels import Refused, check_bits, describe, fingerprint

SLACK = 1.25  # a build or run starts only when this times its estimate fits before the deadline
FRESH = 2.0  # a new engine's bit check / the same passes on a warm engine, until a check is seen (1.5-1.8 seen)
KERNEL_SECONDS = 1.0  # the least wall a kernel's compile is estimated at (0.6-0.9 s seen at load 7-9 on 2 CPUs)
TG_PROMPT = 16  # tokens before a decode run (untimed, on the wall clock)
MIN_TG = 4  # decode steps of the shortest tg run
MAX_TG = 64
MAX_PP_PASSES = 4  # a pp run is 1 to 4 prompts of the largest batch
RUN_SHARE = 80  # a run is sized to about 1/80 of the limit


@dataclass
class Candidate:
    threads: int
    batch: int
    matmul: MatmulChoice = field(default_factory=MatmulChoice)
    prompt_pass: int | None = None  # prompt rows a pass takes at most (None: the engine's default)
    refused: str | None = None  # why its engine was refused (its logits differ), None: not refused
    tg: list[float] = field(default_factory=list)  # tokens/s of each run
    pp: list[float] = field(default_factory=list)
    walls: dict[str, list[float]] = field(default_factory=lambda: {"tg": [], "pp": []})  # each run's wall seconds

    @property
    def key(self) -> tuple:
        return self.threads, self.batch, self.matmul, self.prompt_pass

    def label(self) -> str:
        """How a progress line names its passes: the engine's default, or the rows asked for."""
        return "default pass" if self.prompt_pass is None else f"pass {self.prompt_pass}"

    def median(self, kind: str) -> float | None:
        rates = getattr(self, kind)
        return statistics.median(rates) if rates else None

    def record(self, kind: str, tokens: int, took: float, wall: float) -> None:
        getattr(self, kind).append(tokens / took)
        self.walls[kind].append(wall)

    def to_json(self) -> dict:
        tg, pp = self.median("tg"), self.median("pp")
        data = {"threads": self.threads, "batch": self.batch, "tg": None if tg is None else round(tg, 2),
                "pp": None if pp is None else round(pp, 2), "runs": max(len(self.tg), len(self.pp))}
        if self.prompt_pass is not None:
            data["prompt_pass"] = self.prompt_pass
        if self.matmul != MatmulChoice():
            data["matmul"] = self.matmul.to_json()
        if self.refused:
            data["refused"] = self.refused
        return data


@dataclass(frozen=True)
class Sizes:
    pp: int  # prompt tokens per pp run, a multiple of every prompt pass tried
    tg: int  # decode steps per tg run
    prompt: tuple[int, ...]  # the fixed prompt's ids (a pp run takes the first pp, a tg run TG_PROMPT)

    def units(self, kind: str) -> int:
        return self.pp if kind == "pp" else self.tg


class Walls:
    """The longest wall seconds a unit (a prompt token, a decode step) seen by kind and thread count,
    and the estimates they give (the module's docstring)."""

    def __init__(self):
        self.per_unit: dict[tuple[str, int], float] = {}

    def add(self, kind: str, threads: int, seconds: float, units: int) -> None:
        key = (kind, threads)
        self.per_unit[key] = max(self.per_unit.get(key, 0.0), seconds / units)

    def estimate(self, kind: str, threads: int, units: int) -> float:
        """units x the wall a unit at the fewest seen threads t >= threads, times t/threads; with
        none at or above, the longest at any count; 0 when none of the kind was seen."""
        seen = {t: s for (k, t), s in self.per_unit.items() if k == kind}
        above = [t for t in seen if t >= threads]
        if above:
            t = min(above)
            return units * seen[t] * t / threads
        return units * max(seen.values(), default=0.0)


class Engines:
    """The search's engines by (threads, batch, matmul), each built on first use and checked: its
    logits for the fixed prompt must have the first engine's bits (else Refused)."""

    def __init__(self, graph, weights, device: str, prompt: tuple[int, ...], *, n_ctx: int, check_tokens: int):
        self.graph, self.weights, self.device, self.prompt = graph, weights, device, prompt
        self.n_ctx, self.check_tokens = n_ctx, check_tokens
        self.built: dict[tuple, object] = {}
        self.refused: dict[tuple, Refused] = {}  # engines whose bits differed: never built again
        self.fingerprints: dict[tuple, str] = {}
        self.kernels = len(graph_weights(graph))  # quantized matmul kernels a kernel set compiles at most
        self.opening = 0.0  # the longest wall opening an engine took, its compiles taken out
        self.compile = KERNEL_SECONDS  # the longest wall one kernel's compile took, at least KERNEL_SECONDS
        self.checks = Walls()  # the bit checks' walls (all but the first engine's)

    def build_estimate(self, c: Candidate, walls: Walls) -> float:
        """Wall seconds building c's engine would take: 0 once built or refused (the module's docstring)."""
        if c.key in self.built or c.key in self.refused:
            return 0.0
        if self.checks.per_unit:
            check = self.checks.estimate("check", c.threads, 1)
        else:
            check = FRESH * (walls.estimate("pp", c.threads, self.check_tokens) + walls.estimate("tg", c.threads, 1))
        new_kernels = all(key[2] != c.matmul for key in self.built)
        return self.opening + check + (self.kernels * self.compile if new_kernels else 0.0)

    def __call__(self, c: Candidate):
        if c.key in self.refused:
            raise self.refused[c.key]
        if c.key not in self.built:
            engine, bits = self._open_and_check(c)
            first = next(iter(self.fingerprints.values()), bits)
            self.fingerprints[c.key] = bits
            try:
                check_bits(f"threads {c.threads}, {c.label()}, {describe(c.matmul)}", bits, first)
            except Refused as exc:
                self.refused[c.key] = exc
                raise
            self.built[c.key] = engine
        return self.built[c.key]

    def _open_and_check(self, c: Candidate) -> tuple[object, str]:
        """c's engine and its logits' fingerprint, the walls of its opening and its check (each with
        the kernel compiles in it taken out: a new set's kernels compile in both) and of each compile
        noted for the estimates."""
        from kinetic.runtime.engine import Engine

        compiles = default_jit().stats.compile_seconds  # each compile's wall, this process's
        seen = len(compiles)
        began = time.monotonic()
        engine = Engine(self.graph, self.weights, n_ctx=self.n_ctx, batch=c.batch, device=self.device,
                        threads=c.threads, matmul=c.matmul, prompt_pass=c.prompt_pass)
        opened, opening_compiles = time.monotonic(), sum(compiles[seen:])
        bits = fingerprint(engine, self.prompt, self.check_tokens)
        checked = time.monotonic() - opened - (sum(compiles[seen:]) - opening_compiles)
        self.opening = max(self.opening, opened - began - opening_compiles)
        if self.fingerprints:  # the first engine's check has the process's first calls in it
            self.checks.add("check", c.threads, checked, 1)
        self.compile = max([self.compile, *compiles[seen:]])
        return engine, bits


@contextmanager
def _no_gc():
    """No garbage collection pause inside a timed part (collections happen between runs instead)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run(engine, kind: str, sizes: Sizes, deadline: float = float("inf")) -> float | None:
    """Seconds of one timed run: `pp` a prompt of sizes.pp tokens, `tg` sizes.tg decode steps after
    TG_PROMPT untimed ones; None when a tg run reached `deadline` (monotonic) before its last step."""
    seq = engine.new_sequence()
    if kind == "pp":
        with _no_gc():
            start = time.perf_counter()
            engine.prefill(seq, list(sizes.prompt[: sizes.pp]))
            return time.perf_counter() - start
    logits = engine.prefill(seq, list(sizes.prompt[:TG_PROMPT]))
    with _no_gc():
        start = time.perf_counter()
        for step in range(sizes.tg):
            if step and time.monotonic() >= deadline:
                return None
            logits = engine.decode(seq, int(np.argmax(logits)))
        return time.perf_counter() - start


def calibrate(engine, default: Candidate, walls: Walls, seconds: float, prompt: tuple[int, ...],
              pass_tokens: int) -> Sizes:
    """Run lengths for this model and limit: about seconds/RUN_SHARE a run (pp: 1 to MAX_PP_PASSES
    prompts of pass_tokens; tg: MIN_TG to MAX_TG steps), from one run of each kind at the least sizes
    on the default candidate's engine. Those two runs count as the candidate's first where its sizes
    stay the least (a short limit: its decode and prompt are measured however little time is left)."""
    least = Sizes(pp=pass_tokens, tg=MIN_TG, prompt=prompt)
    took, wall = {}, {}
    for kind in ("pp", "tg"):
        began = time.monotonic()
        took[kind] = run(engine, kind, least)
        wall[kind] = time.monotonic() - began
        walls.add(kind, default.threads, wall[kind], least.units(kind))
    target = min(max(seconds / RUN_SHARE, 0.05), 1.5)
    pp_rate, tg_rate = pass_tokens / max(took["pp"], 1e-6), MIN_TG / max(took["tg"], 1e-6)
    sizes = Sizes(pp=pass_tokens * int(min(max(pp_rate * target // pass_tokens, 1), MAX_PP_PASSES)),
                  tg=int(min(max(tg_rate * target, MIN_TG), MAX_TG)), prompt=prompt)
    for kind in ("pp", "tg"):
        if sizes.units(kind) == least.units(kind):
            default.record(kind, least.units(kind), took[kind], wall[kind])
    return sizes


def measure(candidates: list[Candidate], kinds: tuple[str, ...], engines: Engines, walls: Walls, sizes: Sizes,
            deadline: float, report: Callable[[str], None], now: Callable[[], float] = time.monotonic) -> None:
    """Rounds over the candidates (rotated order, kinds alternating) until no build and run would end
    before `deadline` (a `now` time; one that would not is skipped, the round goes on). A refused
    candidate is not run again."""
    for round_no in itertools.count():
        order = candidates[round_no % len(candidates):] + candidates[: round_no % len(candidates)]
        kinds_now = kinds if round_no % 2 == 0 else kinds[::-1]
        ran = False
        for c, kind in ((c, kind) for c in order for kind in kinds_now):
            if c.refused:
                continue
            own = c.walls[kind]
            estimate = max(own) if own else walls.estimate(kind, c.threads, sizes.units(kind))
            if deadline - now() < SLACK * (estimate + engines.build_estimate(c, walls)):
                continue
            ran = True
            try:
                built = engines(c)
            except Refused as exc:
                c.refused = exc.message
                report(f"refused threads {c.threads} {c.label()}")
                continue
            began = now()
            took = run(built, kind, sizes, deadline)
            if took is None:  # a tg run cut at the deadline: not counted
                continue
            wall = now() - began
            walls.add(kind, c.threads, wall, sizes.units(kind))
            c.record(kind, sizes.units(kind), took, wall)
            rate = sizes.units(kind) / took
            report(f"threads {c.threads} {c.label()} {describe(c.matmul)}: {kind} {rate:.1f} tok/s")
        if not ran:
            return
