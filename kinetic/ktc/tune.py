"""`kinetic compile --tune`: a bounded search for the fastest CPU settings on this machine.

Owns: the candidates, the measuring, the choice and the tuned Profile with its measured numbers.
Does not own the engine (it builds Engines as any caller would and times `prefill` and `decode`),
the profile's format (profile.py) or the command line (kinetic/cli/compile_cmd.py).

The knobs are three the CPU runtime takes, `Engine(threads=, prompt_pass=, matmul=)`; `batch`, the
grid prompts are cut on and warm states stored at, stays the default (DEFAULT_BATCH, 128):

* threads: the compiled step runs every pass, prompt and decode alike, on one thread count, so one
  count is chosen. Objective: decode tokens/s (the speed an answer streams at, what tg128
  measures); counts whose decode median is within TIE of the best are tied, and the tie goes to
  the faster prompt. Prompt rate for this is measured at the default prompt pass.
* prompt_pass (prompt rows one pass takes at most, whole grid chunks: 128, 256 or 512): only prompt
  passes depend on it (a decode pass is one row), so it is chosen by prompt tokens/s at the chosen
  thread count, on prompts of 512 tokens (4, 2 or 1 passes); within TIE, the default (the engine's,
  CPU_PROMPT_PASS) wins, else the smaller pass (smaller arenas). A model whose passes do not merge
  (a recurrent one: Engine.default_prompt_pass is its grid) has no such phase. The grid used to be
  searched instead (32/64/128), but once one CPU pass took up to 512 rows a 512-token prompt ran as
  one pass whatever the grid, and those candidates timed identical passes.
* matmul (the quantized matmul kernels: tile rows, wide 512-bit paths on or off per weight type;
  tune_kernels.py): only prompt passes tile (a decode row runs alone), so they are chosen by prompt
  tokens/s at the chosen threads and prompt pass; within TIE, the default kernels win.

No knob changes a bit of the output (threads split rows, never a sum; a row's sums do not depend on
its pass, its tile or the path; every pass ends at a grid point), so a tuned profile changes speed
only. The search holds itself to it: each engine it builds first runs one fixed prompt and decode
step, and an engine whose logits differ in a bit from the first engine's is refused
(tune_kernels.fingerprint), never timed or chosen.

Measuring (tune_runs.py): tg = decode steps after a short fixed prompt, each feeding back the likeliest
token (nothing drafted); pp = one fixed prompt of random ids. The candidates of a phase are measured
in rounds, each round in a rotated order, and the median of each candidate's runs counts. Run
lengths are scaled to the time limit from the first engine's two shortest runs; a phase starts a
build or run only when its estimate of everything it costs on the wall clock ends before the phase's
share of the time, so the search ends within the limit (tune_runs.py says how, and what is not
bounded: the first engine and those two runs).
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

import numpy as np

from kinetic.ktc.profile import Profile, default_profile
from kinetic.ktc.tune_kernels import FINGERPRINT_EXTRA, choose_kernels, describe, kernel_candidates
from kinetic.ktc.tune_runs import TG_PROMPT, Candidate, Engines, Walls, calibrate, measure

PROMPT_PASSES = (128, 256, 512)  # prompt rows per pass tried (whole 128-row grid chunks)
TIE = 0.02  # medians within 2% of the best count as tied
TOKEN_SEED = 0  # the fixed prompt: random ids from this seed, as kinetic bench makes them
THREAD_SHARE = 0.5  # of the search time for the thread counts (0.25 when there is one: its decode speed)
PASS_SHARE = 0.4  # of the time left after them for the prompt passes; the rest for the kernels
N_CTX = 4 * max(PROMPT_PASSES) + TG_PROMPT + 64 + 1  # the longest pp run, or the prompt and longest tg run
# the bit check's prompt (fits N_CTX), cut differently by every pass tried: 261 rows are one pass at 512,
# 256 + 5 at 256 and 128 + 128 + 5 at 128 (full matmul tiles and leftover rows in each)
FINGERPRINT_TOKENS = max(PROMPT_PASSES) // 2 + FINGERPRINT_EXTRA


def thread_candidates(cpus: int) -> list[int]:
    """Every count up to 8; on larger machines 1, 2, 4, 6, 8 and eighths of the CPUs."""
    if cpus <= 8:
        return list(range(1, cpus + 1))
    return sorted({1, 2, 4, 6, 8} | {cpus * k // 8 for k in range(2, 9)})


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


def tune(graph, weights, *, seconds: float = 120.0, device: str = "cpu",
         progress: ProgressBar | None = None, cpus: int | None = None) -> Profile:
    """The default profile with threads, prompt pass and matmul kernels measured best on this machine,
    `tuned: true`, and the numbers in `measured`. Ends within `seconds` (tune_runs.py: the bound),
    or right after the first engine and its two runs when those alone take longer."""
    start = time.monotonic()
    deadline = start + seconds
    from kinetic.codegen.cpu.step import available_cpus
    from kinetic.codegen.cpu.target import host
    from kinetic.runtime.engine import DEFAULT_BATCH

    cpus = cpus or available_cpus()
    bar = progress or ProgressBar(seconds)

    def report(note: str) -> None:
        bar.update(time.monotonic() - start, note)

    prompt = prompt_ids(graph)
    engines = Engines(graph, weights, device, prompt, n_ctx=N_CTX, check_tokens=FINGERPRINT_TOKENS)
    walls = Walls()
    threads = [Candidate(t, DEFAULT_BATCH) for t in thread_candidates(cpus)]
    default = next(c for c in threads if c.threads == cpus)
    first = engines(default)
    sizes = calibrate(first, default, walls, seconds, prompt, max(PROMPT_PASSES))
    first_seconds = time.monotonic() - start
    kernels = kernel_candidates(graph, host().best_variant())
    passes = pass_candidates(first.prompt_pass)
    report(f"{len(threads)} thread counts, prompt passes {'/'.join(map(str, passes)) or 'fixed'}, "
           f"{len(kernels)} kernel sets")
    share = THREAD_SHARE if len(threads) > 1 else THREAD_SHARE / 2
    measure(threads, ("tg", "pp"), engines, walls, sizes, _share_of(deadline, share), report)
    best_threads = _choose_threads(threads, cpus)
    # measured afresh, side by side; the engine's own pass size is the thread phase's engine (None)
    pass_runs = [Candidate(best_threads, DEFAULT_BATCH, prompt_pass=None if p == first.prompt_pass else p)
                 for p in passes]
    measure(pass_runs, ("pp",), engines, walls, sizes, _share_of(deadline, PASS_SHARE), report)
    chosen_pass = _choose_pass(pass_runs, first.prompt_pass)
    best_pass = None if chosen_pass == first.prompt_pass else chosen_pass  # None: the engines built so far
    matmuls = [Candidate(best_threads, DEFAULT_BATCH, matmul=m, prompt_pass=best_pass) for m in kernels]
    measure(matmuls, ("pp",), engines, walls, sizes, deadline, report)
    best = Candidate(best_threads, DEFAULT_BATCH, choose_kernels(matmuls, TIE), prompt_pass=best_pass)
    bar.update(min(time.monotonic() - start, seconds),
               f"chose threads {best.threads}, prompt pass {chosen_pass}, {describe(best.matmul)}")
    bar.close()
    measured = {"seconds": round(time.monotonic() - start, 2), "limit_seconds": seconds, "cpus": cpus,
                "first_seconds": round(first_seconds, 2), "tg_tokens": sizes.tg, "pp_tokens": sizes.pp,
                **_phases(best, chosen_pass, threads, pass_runs, matmuls), "bits_checked": len(engines.fingerprints)}
    return replace(default_profile(device), threads=best.threads, batch=best.batch, matmul_tile=best.matmul.tile,
                   matmul_narrow=tuple(sorted(best.matmul.narrow)), prompt_pass=chosen_pass if passes else None,
                   tuned=True, measured=measured)


def pass_candidates(engine_pass: int) -> tuple[int, ...]:
    """The prompt passes to try: PROMPT_PASSES when the engine merges grid chunks into passes of
    their largest (its default, CPU_PROMPT_PASS); none otherwise (a recurrent model, another device)."""
    return PROMPT_PASSES if engine_pass == max(PROMPT_PASSES) else ()


def _share_of(deadline: float, share: float) -> float:
    """The deadline of a phase that takes `share` of the time left before `deadline`."""
    now = time.monotonic()
    return now + max(deadline - now, 0.0) * share


def _phases(best: Candidate, chosen_pass: int, threads: list[Candidate], passes: list[Candidate],
            matmuls: list[Candidate]) -> dict:
    """`measured`'s choice and phases: the chosen setting's medians (its prompt from the latest phase
    that measured it), each phase's candidates and the refused ones."""
    same = [c for c in matmuls + passes + threads if c.key == best.key and c.pp]
    chosen_tg = next(c for c in threads if c.threads == best.threads).median("tg")
    chosen_pp = same[0].median("pp") if same else None
    return {
        "objective": "decode tokens/s; within 2% the faster prompt (threads); prompt tokens/s (prompt_pass, matmul)",
        "chosen": {"threads": best.threads, "batch": best.batch, "prompt_pass": chosen_pass,
                   "matmul": best.matmul.to_json(),
                   "tg": None if chosen_tg is None else round(chosen_tg, 2),
                   "pp": None if chosen_pp is None else round(chosen_pp, 2)},
        "threads": [c.to_json() for c in threads],
        "prompt_pass": [c.to_json() for c in passes],
        "matmul": [c.to_json() for c in matmuls],
        "refused": [c.to_json() for c in threads + passes + matmuls if c.refused],
    }


def prompt_ids(graph) -> tuple[int, ...]:
    """The fixed prompt every run and the bit check read: random ids from TOKEN_SEED."""
    n_vocab = graph.output("logits").type.shape[1]
    return tuple(int(t) for t in np.random.default_rng(TOKEN_SEED).integers(0, n_vocab, 4 * max(PROMPT_PASSES)))


def _choose_threads(candidates: list[Candidate], cpus: int) -> int:
    measured = [c for c in candidates if c.tg]
    if not measured:
        return cpus
    best = max(c.median("tg") for c in measured)
    tied = [c for c in measured if c.median("tg") >= best * (1 - TIE)]
    return max(tied, key=lambda c: (c.median("pp") or 0.0, c.median("tg"))).threads


def _choose_pass(candidates: list[Candidate], default: int) -> int:
    """The prompt pass with the best prompt median (a candidate's None is the engine's `default`);
    within TIE the default, else the smallest tied pass; the default when none was measured."""
    measured = [c for c in candidates if c.pp]
    if not measured:
        return default
    best = max(c.median("pp") for c in measured)
    tied = [c.prompt_pass or default for c in measured if c.median("pp") >= best * (1 - TIE)]
    return default if default in tied else min(tied)


def summary(profile: Profile) -> str:
    """One line: what was chosen and measured, beside the defaults' numbers when they were measured."""
    from kinetic.runtime.engine import DEFAULT_BATCH

    m = profile.measured or {}
    chosen = m.get("chosen", {})
    pass_note = "" if profile.prompt_pass is None else f", prompt pass {profile.prompt_pass}"
    line = (f"  tuned in {m.get('seconds', 0):.1f} s (limit {m.get('limit_seconds', 0):.0f} s, {m.get('cpus')} CPUs): "
            f"threads {profile.threads}, batch {profile.batch}{pass_note}, {describe(profile.matmul_choice())}: "
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
