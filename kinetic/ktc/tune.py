"""`kinetic compile --tune`: a bounded search for the fastest CPU settings on this machine.

Owns: the candidates, the measuring, the choice and the tuned Profile with its measured numbers.
Does not own the engine (it builds Engines as any caller would and times `prefill` and `decode`),
the profile's format (profile.py) or the command line (kinetic/cli/compile_cmd.py).

The knobs are the three the CPU runtime takes, `Engine(threads=, batch=, matmul=)`:

* threads: the compiled step runs every pass, prompt and decode alike, on one thread count, so one
  count is chosen. Objective: decode tokens/s (the speed an answer streams at, what tg128
  measures); counts whose decode median is within TIE of the best are tied, and the tie goes to
  the faster prompt. Prompt rate for this is measured at the default batch.
* batch (prompt rows per pass): only prompt passes depend on it (a decode pass is one row), so it
  is chosen by prompt tokens/s at the chosen thread count; within TIE, the default wins, else the
  smaller batch (less memory).
* matmul (the quantized matmul kernels: tile rows, wide 512-bit paths on or off per weight type;
  tune_kernels.py): only prompt passes tile (a decode row runs alone), so they are chosen by prompt
  tokens/s at the chosen threads and batch; within TIE, the default kernels win.

No knob changes a bit of the output (threads split rows, never a sum; a row's sums do not depend on
its batch, its tile or the path), so a tuned profile changes speed only. The search holds itself to
it: each engine it builds first runs one fixed prompt and decode step, and an engine whose logits
differ in a bit from the first engine's is refused (tune_kernels.fingerprint), never timed or chosen.

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
from dataclasses import dataclass, field, replace

import numpy as np

from kinetic.codegen.cpu.matmul_choice import MatmulChoice
from kinetic.ktc.profile import Profile, default_profile
from kinetic.ktc.tune_kernels import (
    FINGERPRINT_EXTRA,
    Refused,
    check_bits,
    choose_kernels,
    describe,
    fingerprint,
    kernel_candidates,
)

BATCHES = (32, 64, 128)  # prompt rows per pass tried
TIE = 0.02  # medians within 2% of the best count as tied
TG_PROMPT = 16  # tokens before a decode run (untimed)
TOKEN_SEED = 0  # the fixed prompt: random ids from this seed, as kinetic bench makes them
THREAD_SHARE = 0.5  # of the search time for the thread counts (0.25 when there is one: its decode speed)
BATCH_SHARE = 0.4  # of the time left after them for the batches; the rest for the kernels
NEW_KERNELS_SECONDS = 5.0  # a kernel set's first build, until one was measured (a compile of its kernels)
N_CTX = 4 * max(BATCHES) + TG_PROMPT + 64 + 1  # the longest pp run, or the prompt and longest tg run
FINGERPRINT_TOKENS = max(BATCHES) + FINGERPRINT_EXTRA  # the bit check's prompt (fits N_CTX)


def thread_candidates(cpus: int) -> list[int]:
    """Every count up to 8; on larger machines 1, 2, 4, 6, 8 and eighths of the CPUs."""
    if cpus <= 8:
        return list(range(1, cpus + 1))
    return sorted({1, 2, 4, 6, 8} | {cpus * k // 8 for k in range(2, 9)})


@dataclass
class Candidate:
    threads: int
    batch: int
    matmul: MatmulChoice = field(default_factory=MatmulChoice)
    refused: str | None = None  # why its engine was refused (its logits differ), None: not refused
    tg: list[float] = field(default_factory=list)  # tokens/s of each run
    pp: list[float] = field(default_factory=list)
    seconds: dict[str, list[float]] = field(default_factory=lambda: {"tg": [], "pp": []})

    def median(self, kind: str) -> float | None:
        rates = getattr(self, kind)
        return statistics.median(rates) if rates else None

    def to_json(self) -> dict:
        tg, pp = self.median("tg"), self.median("pp")
        data = {"threads": self.threads, "batch": self.batch, "tg": None if tg is None else round(tg, 2),
                "pp": None if pp is None else round(pp, 2), "runs": max(len(self.tg), len(self.pp))}
        if self.matmul != MatmulChoice():
            data["matmul"] = self.matmul.to_json()
        if self.refused:
            data["refused"] = self.refused
        return data


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
    """The default profile with threads, batch and matmul kernels measured best on this machine,
    `tuned: true`, and the numbers in `measured`. Ends within `seconds` (plus at most one run's
    misestimate)."""
    from kinetic.codegen.cpu.step import available_cpus
    from kinetic.codegen.cpu.target import host
    from kinetic.runtime.engine import DEFAULT_BATCH

    start = time.monotonic()
    clock = _Clock(start + seconds)
    cpus = cpus or available_cpus()
    bar = progress or ProgressBar(seconds)
    prompt = prompt_ids(graph)
    engine = _Engines(graph, weights, device, prompt)

    sizes = _calibrate(engine(Candidate(cpus, DEFAULT_BATCH)), seconds, prompt)
    kernels = kernel_candidates(graph, host().best_variant())
    note = (f"{len(thread_candidates(cpus))} thread counts, batches {'/'.join(map(str, BATCHES))}, "
            f"{len(kernels)} kernel sets")
    bar.update(time.monotonic() - start, note)
    threads = [Candidate(t, DEFAULT_BATCH) for t in thread_candidates(cpus)]
    share = THREAD_SHARE if len(threads) > 1 else THREAD_SHARE / 2
    _measure(threads, ("tg", "pp"), engine, sizes, _Clock(time.monotonic() + clock.left() * share), bar, start)
    best_threads = _choose_threads(threads, cpus)
    batches = [Candidate(best_threads, b) for b in BATCHES]  # measured afresh, side by side
    _measure(batches, ("pp",), engine, sizes, _Clock(time.monotonic() + clock.left() * BATCH_SHARE), bar, start)
    best_batch = _choose_batch(batches, DEFAULT_BATCH)
    matmuls = [Candidate(best_threads, best_batch, matmul=m) for m in kernels]
    _measure(matmuls, ("pp",), engine, sizes, clock, bar, start)
    best_matmul = choose_kernels(matmuls, TIE)
    bar.update(min(time.monotonic() - start, seconds),
               f"chose threads {best_threads}, batch {best_batch}, {describe(best_matmul)}")
    bar.close()
    chosen = _pick(matmuls, best_matmul) or _pick(batches, MatmulChoice(), best_batch)
    chosen_tg = next(t for t in threads if t.threads == best_threads).median("tg")
    refused = [c.to_json() for c in threads + batches + matmuls if c.refused]
    measured = {
        "seconds": round(time.monotonic() - start, 2), "limit_seconds": seconds, "cpus": cpus,
        "objective": "decode tokens/s; within 2% the faster prompt (threads); prompt tokens/s (batch, matmul)",
        "tg_tokens": sizes.tg, "pp_tokens": sizes.pp,
        "chosen": {"threads": best_threads, "batch": best_batch, "matmul": best_matmul.to_json(),
                   "tg": None if chosen_tg is None else round(chosen_tg, 2),
                   "pp": None if chosen is None or chosen.median("pp") is None else round(chosen.median("pp"), 2)},
        "threads": [c.to_json() for c in threads],
        "batch": [c.to_json() for c in batches],
        "matmul": [c.to_json() for c in matmuls],
        "bits_checked": len(engine.fingerprints), "refused": refused,
    }
    return replace(default_profile(device), threads=best_threads, batch=best_batch, matmul_tile=best_matmul.tile,
                   matmul_narrow=tuple(sorted(best_matmul.narrow)), tuned=True, measured=measured)


def prompt_ids(graph) -> tuple[int, ...]:
    """The fixed prompt every run and the bit check read: random ids from TOKEN_SEED."""
    n_vocab = graph.output("logits").type.shape[1]
    return tuple(int(t) for t in np.random.default_rng(TOKEN_SEED).integers(0, n_vocab, 4 * max(BATCHES)))


def _pick(candidates: list[Candidate], matmul: MatmulChoice, batch: int | None = None) -> Candidate | None:
    return next((c for c in candidates if c.matmul == matmul and (batch is None or c.batch == batch)), None)


class _Engines:
    """The search's engines by (threads, batch, matmul), each built on first use and checked: its
    logits for the fixed prompt must have the first engine's bits (else Refused), then one untimed
    prompt chunk and decode step load its kernels and arenas."""

    def __init__(self, graph, weights, device: str, prompt: tuple[int, ...]):
        self.graph, self.weights, self.device, self.prompt = graph, weights, device, prompt
        self.built: dict[tuple, object] = {}
        self.fingerprints: dict[tuple, str] = {}
        self.build_seconds = 0.0  # the longest build so far, check included
        self.kernel_build_seconds: float | None = None  # the longest build of a new kernel set (it compiles kernels)
        self.longest: dict[str, float | None] = {"pp": None, "tg": None}  # the longest run of each kind so far

    def has(self, c: Candidate) -> bool:
        return (c.threads, c.batch, c.matmul) in self.built

    def build_estimate(self, c: Candidate) -> float:
        """Seconds building c's engine would take: 0 when built; a kernel set no engine has yet
        compiles its kernels: at least twice a build of known kernels and NEW_KERNELS_SECONDS until
        one was measured (the first engine's kernels may have come from the disk cache, so its build
        says nothing of a compile)."""
        if self.has(c):
            return 0.0
        if any(key[2] == c.matmul for key in self.built):
            return self.build_seconds
        known = NEW_KERNELS_SECONDS if self.kernel_build_seconds is None else self.kernel_build_seconds
        return max(known, 2 * self.build_seconds)

    def __call__(self, c: Candidate):
        from kinetic.runtime.engine import Engine

        key = (c.threads, c.batch, c.matmul)
        if key not in self.built:
            began = time.monotonic()
            new_kernels = bool(self.built) and all(k[2] != c.matmul for k in self.built)
            engine = Engine(self.graph, self.weights, n_ctx=N_CTX, batch=c.batch, device=self.device,
                            threads=c.threads, matmul=c.matmul)
            bits = fingerprint(engine, self.prompt, FINGERPRINT_TOKENS)
            first = next(iter(self.fingerprints.values()), bits)
            self.fingerprints[key] = bits
            check_bits(f"threads {c.threads}, batch {c.batch}, {describe(c.matmul)}", bits, first)
            _warm_up(engine, self.prompt[: c.batch])
            took = time.monotonic() - began
            if new_kernels:
                self.kernel_build_seconds = max(self.kernel_build_seconds or 0.0, took)
            else:
                self.build_seconds = max(self.build_seconds, took)
            self.built[key] = engine
        return self.built[key]


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


def _measure(candidates: list[Candidate], kinds: tuple[str, ...], engine: _Engines, sizes: _Sizes, clock: _Clock,
             bar: ProgressBar, start: float) -> None:
    """Rounds over the candidates (rotated order, kinds alternating) until no run would end before
    the clock (a run that would is skipped, the round goes on). A candidate's first run also builds
    and checks its engine: its estimate is twice the longest run of that kind so far (in any phase)
    plus, unless its engine is built, the longest build. A refused candidate is not run again."""
    tokens = {"pp": sizes.pp, "tg": sizes.tg}
    guess = engine.longest  # seconds of a run, for candidates not run yet (every phase's runs)
    for round_no in itertools.count():
        order = candidates[round_no % len(candidates):] + candidates[: round_no % len(candidates)]
        kinds_now = kinds if round_no % 2 == 0 else kinds[::-1]
        ran = False
        for c in order:
            for kind in kinds_now:
                if c.refused:
                    continue
                known = c.seconds[kind]
                estimate = statistics.median(known) if known else 2 * (guess[kind] or 0.5)
                estimate += engine.build_estimate(c)
                if clock.left() < estimate * 1.25:
                    continue
                ran = True
                try:
                    built = engine(c)
                except Refused as exc:
                    c.refused = exc.message
                    bar.update(time.monotonic() - start, f"refused threads {c.threads} batch {c.batch}")
                    continue
                took = _run(built, kind, sizes)
                c.seconds[kind].append(took)
                getattr(c, kind).append(tokens[kind] / took)
                guess[kind] = took if guess[kind] is None else max(guess[kind], took)
                bar.update(time.monotonic() - start, f"threads {c.threads} batch {c.batch} {describe(c.matmul)}: "
                           f"{kind} {tokens[kind] / took:.1f} tok/s")
        if not ran:
            return


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
            f"threads {profile.threads}, batch {profile.batch}, {describe(profile.matmul_choice())}: "
            f"tg {_rate(chosen.get('tg'))}, pp {_rate(chosen.get('pp'))}")
    default = next((c for c in m.get("threads", []) if (c["threads"], c["batch"]) == (m.get("cpus"), DEFAULT_BATCH)),
                   None)
    if default is not None:
        line += (f" (defaults threads {default['threads']}, batch {DEFAULT_BATCH}: tg {_rate(default['tg'])}, "
                 f"pp {_rate(default['pp'])})")
    if "bits_checked" in m:
        refused = len(m.get("refused", []))
        line += f"; {m['bits_checked']} engines' logits checked bit for bit"
        line += f", {refused} refused" if refused else ""
    return line


def _rate(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.1f} tok/s"
