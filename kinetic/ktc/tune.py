"""`kinetic compile --tune`: a bounded search for the fastest CPU settings on this machine.

Owns: the candidates, the measuring, the choice and the tuned Profile with its measured numbers.
Does not own the engine (it builds Engines as any caller would and times `prefill` and `decode`),
the profile's format (profile.py) or the command line (kinetic/cli/compile_cmd.py).

The knobs are the two the CPU runtime takes today, `Engine(threads=, batch=)`:

* threads: the compiled step runs every pass, prompt and decode alike, on one thread count, so one
  count is chosen. Objective: decode tokens/s (the speed an answer streams at, what tg128
  measures); counts whose decode median is within TIE of the best are tied, and the tie goes to
  the faster prompt. Prompt rate for this is measured at the default batch.
* batch (prompt rows per pass): only prompt passes depend on it (a decode pass is one row), so it
  is chosen by prompt tokens/s at the chosen thread count; within TIE, the default wins, else the
  smaller batch (less memory).

Neither knob changes a bit of the output (threads split rows, never a sum; a row's sums do not
depend on its batch), so a tuned profile changes speed only.

Measuring: tg = decode steps after a short fixed prompt, each feeding back the likeliest token
(nothing drafted); pp = one fixed prompt of random ids. The candidates of a phase are measured in
rounds, each round in a rotated order, and the median of each candidate's runs counts. Run lengths
are scaled to the time limit from a first warm-up measurement; the search stops starting runs it
estimates would end past the limit, so it ends within it (building engines included).
"""

from __future__ import annotations

import gc
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from kinetic.ktc.profile import Profile, default_profile

BATCHES = (32, 64, 128)  # prompt rows per pass tried
TIE = 0.02  # medians within 2% of the best count as tied
TG_PROMPT = 16  # tokens before a decode run (untimed)
TOKEN_SEED = 0  # the fixed prompt: random ids from this seed, as kinetic bench makes them
THREAD_SHARE = 0.6  # of the search time for the thread counts (0.3 when there is one: its decode speed)
N_CTX = 4 * max(BATCHES) + TG_PROMPT + 64 + 1  # the longest pp run, or the prompt and longest tg run


def thread_candidates(cpus: int) -> list[int]:
    """Every count up to 8; on larger machines 1, 2, 4, 6, 8 and eighths of the CPUs."""
    if cpus <= 8:
        return list(range(1, cpus + 1))
    return sorted({1, 2, 4, 6, 8} | {cpus * k // 8 for k in range(2, 9)})


@dataclass
class Candidate:
    threads: int
    batch: int
    tg: list[float] = field(default_factory=list)  # tokens/s of each run
    pp: list[float] = field(default_factory=list)
    seconds: dict[str, list[float]] = field(default_factory=lambda: {"tg": [], "pp": []})

    def median(self, kind: str) -> float | None:
        rates = getattr(self, kind)
        return statistics.median(rates) if rates else None

    def to_json(self) -> dict:
        tg, pp = self.median("tg"), self.median("pp")
        return {"threads": self.threads, "batch": self.batch, "tg": None if tg is None else round(tg, 2),
                "pp": None if pp is None else round(pp, 2), "runs": max(len(self.tg), len(self.pp))}


class ProgressBar:
    """A plain-text bar on stderr: redrawn in place on a terminal, a line per tenth otherwise."""

    def __init__(self, limit: float, stream=None, width: int = 24):
        self.limit, self.stream, self.width = limit, stream or sys.stderr, width
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.shown = -1

    def update(self, elapsed: float, note: str) -> None:
        share = min(elapsed / self.limit, 1.0)
        filled = int(share * self.width)
        line = (f"  tuning [{'#' * filled}{'.' * (self.width - filled)}] {share * 100:3.0f}% "
                f"{elapsed:5.1f}/{self.limit:.0f} s  {note}")
        if self.tty:
            self.stream.write("\r" + line[:119].ljust(119))
        elif int(share * 10) != self.shown:
            self.stream.write(line + "\n")
        self.shown = int(share * 10)
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


@dataclass
class _Clock:
    deadline: float

    def left(self) -> float:
        return self.deadline - time.monotonic()


def tune(graph, weights, *, seconds: float = 120.0, device: str = "cpu",
         progress: ProgressBar | None = None, cpus: int | None = None) -> Profile:
    """The default profile with threads and batch measured best on this machine, `tuned: true`, and
    the numbers in `measured`. Ends within `seconds` (plus at most one run's misestimate)."""
    from kinetic.codegen.cpu.step import available_cpus
    from kinetic.runtime.engine import DEFAULT_BATCH, Engine

    start = time.monotonic()
    clock = _Clock(start + seconds)
    cpus = cpus or available_cpus()
    bar = progress or ProgressBar(seconds)
    engines: dict[tuple[int, int], Engine] = {}

    n_vocab = graph.output("logits").type.shape[1]
    prompt = tuple(int(t) for t in np.random.default_rng(TOKEN_SEED).integers(0, n_vocab, 4 * max(BATCHES)))

    def engine(threads: int, batch: int) -> Engine:
        """Built on first use, with one untimed prompt chunk and decode step (kernels, arenas)."""
        if (threads, batch) not in engines:
            engines[threads, batch] = Engine(graph, weights, n_ctx=N_CTX, batch=batch, device=device,
                                             threads=threads)
            _warm_up(engines[threads, batch], prompt[:batch])
        return engines[threads, batch]

    sizes = _calibrate(engine(cpus, DEFAULT_BATCH), seconds, prompt)
    note = f"{len(thread_candidates(cpus))} thread counts, batches {'/'.join(map(str, BATCHES))}"
    bar.update(time.monotonic() - start, note)
    threads = [Candidate(t, DEFAULT_BATCH) for t in thread_candidates(cpus)]
    share = THREAD_SHARE if len(threads) > 1 else 0.3
    phase_end = time.monotonic() + clock.left() * share
    _measure(threads, ("tg", "pp"), engine, sizes, _Clock(phase_end), bar, start)
    best_threads = _choose_threads(threads, cpus)
    batches = [Candidate(best_threads, b) for b in BATCHES]  # measured afresh, side by side
    _measure(batches, ("pp",), engine, sizes, clock, bar, start)
    best_batch = _choose_batch(batches, DEFAULT_BATCH)
    bar.update(min(time.monotonic() - start, seconds), f"chose threads {best_threads}, batch {best_batch}")
    bar.close()
    chosen = next(c for c in batches if c.batch == best_batch)
    chosen_tg = next(t for t in threads if t.threads == best_threads).median("tg")
    measured = {
        "seconds": round(time.monotonic() - start, 2), "limit_seconds": seconds, "cpus": cpus,
        "objective": "decode tokens/s; within 2% the faster prompt (threads); prompt tokens/s (batch)",
        "tg_tokens": sizes.tg, "pp_tokens": sizes.pp,
        "chosen": {"threads": best_threads, "batch": best_batch,
                   "tg": None if chosen_tg is None else round(chosen_tg, 2),
                   "pp": None if chosen.median("pp") is None else round(chosen.median("pp"), 2)},
        "threads": [c.to_json() for c in threads],
        "batch": [c.to_json() for c in batches],
    }
    return replace(default_profile(device), threads=best_threads, batch=best_batch, tuned=True, measured=measured)


@dataclass(frozen=True)
class _Sizes:
    pp: int  # prompt tokens per pp run, a multiple of every batch
    tg: int  # decode steps per tg run
    prompt: tuple[int, ...]  # the fixed prompt's ids (a pp run takes the first pp, a tg run TG_PROMPT)


def _calibrate(engine, seconds: float, prompt: tuple[int, ...]) -> _Sizes:
    """Run lengths for this model and limit: about seconds/80 per run (at least 4 decode steps and
    one prompt of the largest batch), from one timed prompt of the largest batch and 4 decode steps."""
    step = max(BATCHES)
    seq = engine.new_sequence()
    t0 = time.perf_counter()
    logits = engine.prefill(seq, list(prompt[:step]))
    t1 = time.perf_counter()
    for _ in range(4):
        logits = engine.decode(seq, int(np.argmax(logits)))
    t2 = time.perf_counter()
    target = min(max(seconds / 80, 0.05), 1.5)
    pp_rate, tg_rate = step / max(t1 - t0, 1e-6), 4 / max(t2 - t1, 1e-6)
    pp = step * int(min(max(pp_rate * target // step, 1), 4))
    tg = int(min(max(tg_rate * target, 4), 64))
    return _Sizes(pp=pp, tg=tg, prompt=prompt)


def _warm_up(engine, tokens) -> None:
    seq = engine.new_sequence()
    engine.decode(seq, int(np.argmax(engine.prefill(seq, list(tokens)))))


def _run(engine, kind: str, sizes: _Sizes) -> float:
    """Seconds of one timed run: `pp` a prompt of sizes.pp tokens, `tg` sizes.tg decode steps."""
    seq = engine.new_sequence()
    if kind == "pp":
        gc.collect()
        start = time.perf_counter()
        engine.prefill(seq, list(sizes.prompt[: sizes.pp]))
        return time.perf_counter() - start
    logits = engine.prefill(seq, list(sizes.prompt[:TG_PROMPT]))
    gc.collect()
    start = time.perf_counter()
    for _ in range(sizes.tg):
        logits = engine.decode(seq, int(np.argmax(logits)))
    return time.perf_counter() - start


def _measure(candidates: list[Candidate], kinds: tuple[str, ...], engine: Callable, sizes: _Sizes, clock: _Clock,
             bar: ProgressBar, start: float) -> None:
    """Rounds over the candidates (rotated order, kinds alternating) until the next run would end
    past the clock. A candidate's first run also builds its engine: its estimate is twice the
    longest run of that kind so far."""
    tokens = {"pp": sizes.pp, "tg": sizes.tg}
    guess = {"pp": None, "tg": None}  # seconds of a run, for candidates not run yet
    for round_no in itertools.count():
        order = candidates[round_no % len(candidates):] + candidates[: round_no % len(candidates)]
        kinds_now = kinds if round_no % 2 == 0 else kinds[::-1]
        for c in order:
            for kind in kinds_now:
                known = c.seconds[kind]
                estimate = statistics.median(known) if known else 2 * (guess[kind] or 0.5)
                if clock.left() < estimate * 1.25:
                    return
                took = _run(engine(c.threads, c.batch), kind, sizes)
                c.seconds[kind].append(took)
                getattr(c, kind).append(tokens[kind] / took)
                guess[kind] = took if guess[kind] is None else max(guess[kind], took)
                bar.update(time.monotonic() - start, f"threads {c.threads} batch {c.batch}: {kind} "
                           f"{tokens[kind] / took:.1f} tok/s")


def _choose_threads(candidates: list[Candidate], cpus: int) -> int:
    measured = [c for c in candidates if c.tg]
    if not measured:
        return cpus
    best = max(c.median("tg") for c in measured)
    tied = [c for c in measured if c.median("tg") >= best * (1 - TIE)]
    return max(tied, key=lambda c: (c.median("pp") or 0.0, c.median("tg"))).threads


def _choose_batch(candidates: list[Candidate], default: int) -> int:
    measured = [c for c in candidates if c.pp]
    if not measured:
        return default
    best = max(c.median("pp") for c in measured)
    tied = [c.batch for c in measured if c.median("pp") >= best * (1 - TIE)]
    return default if default in tied else min(tied)


def summary(profile: Profile) -> str:
    """One line: what was chosen and measured, beside the defaults' numbers when they were measured."""
    from kinetic.runtime.engine import DEFAULT_BATCH

    m = profile.measured or {}
    chosen = m.get("chosen", {})
    line = (f"  tuned in {m.get('seconds', 0):.1f} s (limit {m.get('limit_seconds', 0):.0f} s, {m.get('cpus')} CPUs): "
            f"threads {profile.threads}, batch {profile.batch}: tg {_rate(chosen.get('tg'))}, "
            f"pp {_rate(chosen.get('pp'))}")
    default = next((c for c in m.get("threads", []) if (c["threads"], c["batch"]) == (m.get("cpus"), DEFAULT_BATCH)),
                   None)
    if default is not None:
        line += (f" (defaults threads {default['threads']}, batch {DEFAULT_BATCH}: tg {_rate(default['tg'])}, "
                 f"pp {_rate(default['pp'])})")
    return line


def _rate(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.1f} tok/s"
