"""`kinetic bench --compare`: llama.cpp's and ik_llama.cpp's llama-bench on the same file and threads.

Owns: finding llama.cpp's programs (llama-bench, and the llama-server beside it; never downloading
them) and ik_llama.cpp's llama-bench (a fork with its own CPU kernels: --compare-ik, else
$KINETIC_IK_LLAMA_BENCH, else IK_LLAMA_BENCH_PLACES; absent, the comparison leaves it out),
llama-bench's command line for each build (flags spelled as its --help spells them), running it and
parsing its JSON (`LlamaBenchResult`; both forks print the same shape, ik a few more fields, and
either may print log lines around it), and merging the results of several rounds.
Does not own: llama.cpp's edit test through llama-server (kinetic.bench_llama_edit), the card
(kinetic.bench_card), Kinetic's own tests, timing and table (kinetic.bench, kinetic.bench_report).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from kinetic.errors import KineticError

# Where --compare looks for llama-bench after PATH (Kinetic never downloads it).
LLAMA_BENCH_PLACES = (
    Path.home() / ".cache/kinetic-ref/llama.cpp/build/bin/llama-bench",
    Path("/usr/local/bin/llama-bench"),
)
# ik_llama.cpp's llama-bench (docs/benchmarks.md says how to build it): the environment variable, else here
IK_LLAMA_BENCH_ENV = "KINETIC_IK_LLAMA_BENCH"
IK_LLAMA_BENCH_PLACES = (Path.home() / ".cache/kinetic-ref/ik_llama.cpp/build/bin/llama-bench",)
LLAMA_CPP, IK_LLAMA_CPP = "llama.cpp", "ik_llama.cpp"


@dataclass
class LlamaBenchResult:
    build_number: int
    build_commit: str
    best: dict[str, float]  # test name (pp512, tg128) -> best sample, t/s
    mean: dict[str, float]
    samples: dict[str, list[float]] = field(default_factory=dict)  # every sample, t/s
    engine: str = LLAMA_CPP  # which fork's llama-bench printed it

    @property
    def build(self) -> str:
        return f"b{self.build_number} ({self.build_commit})" if self.build_commit else "(llama-bench not run)"

    @property
    def median(self) -> dict[str, float]:
        return {name: statistics.median(runs) for name, runs in self.samples.items() if runs}


def merge_rounds(rounds: list[LlamaBenchResult], engine: str = LLAMA_CPP) -> LlamaBenchResult:
    """One result from llama-bench's runs of several rounds: every sample kept, the best of all, the
    mean of all (each round's mean stands for its samples when it printed none). No rounds (-p 0 -n 0:
    the edit test alone, nothing for llama-bench to run): no tests and no build."""
    if not rounds:
        return LlamaBenchResult(0, "", {}, {}, {}, engine)
    first = rounds[0]
    samples: dict[str, list[float]] = {}
    for r in rounds:
        for name in r.best:
            samples.setdefault(name, []).extend(r.samples.get(name) or [r.mean[name]])
    return LlamaBenchResult(
        first.build_number, first.build_commit,
        {name: max(runs) for name, runs in samples.items()},
        {name: statistics.fmean(runs) for name, runs in samples.items()},
        samples, first.engine,
    )


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


def find_ik_llama_bench(given: str | None) -> Path | None:
    """ik_llama.cpp's llama-bench: `given` (--compare-ik, a file or its folder), else the file
    $KINETIC_IK_LLAMA_BENCH names, else the usual place; None when none is given and the usual place
    has none. A path given (flag or variable) that holds no program is an error, not a silent skip."""
    named, source = (given, "--compare-ik") if given else (os.environ.get(IK_LLAMA_BENCH_ENV), IK_LLAMA_BENCH_ENV)
    if named:
        path = Path(named).expanduser()
        path = path / "llama-bench" if path.is_dir() else path
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise KineticError(
            f"{source}: no ik_llama.cpp llama-bench program at {path}",
            "Give the path of ik_llama.cpp's llama-bench (or its folder); docs/benchmarks.md says how to build it.",
        )
    return next((p for p in IK_LLAMA_BENCH_PLACES if p.is_file() and os.access(p, os.X_OK)), None)


def ik_absent_line() -> str:
    """The line the card prints when ik_llama.cpp's llama-bench is not found."""
    looked = ", ".join(str(p) for p in IK_LLAMA_BENCH_PLACES)
    return (
        f"ik_llama.cpp not compared: no llama-bench at {looked} (build it as docs/benchmarks.md says, or "
        f"name it with --compare-ik PATH or ${IK_LLAMA_BENCH_ENV})."
    )


def find_llama_server(near: Path | None) -> Path | None:
    """llama-server beside the llama-bench that ran, else on PATH, else in the usual folders."""
    places = [near.parent / "llama-server"] if near else []
    on_path = shutil.which("llama-server")
    places += ([Path(on_path)] if on_path else []) + [p.parent / "llama-server" for p in LLAMA_BENCH_PLACES]
    return next((p for p in places if p.is_file() and os.access(p, os.X_OK)), None)


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
    gpu: bool = False, engine: str = LLAMA_CPP,
) -> LlamaBenchResult:
    """Run one fork's llama-bench and read its JSON (`engine` names the fork in messages and the result)."""
    cmd = llama_bench_command(exe, model, threads=threads, repetitions=repetitions, n_prompt=n_prompt, n_gen=n_gen,
                              gpu=gpu)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        hint = f"Check that it is {engine}'s llama-bench."
        raise KineticError(f"--compare: could not start {exe}: {exc}", hint) from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise KineticError(
            f"--compare: {engine}'s llama-bench failed (exit {proc.returncode}): {tail}",
            f"Run it by hand to see why: {' '.join(cmd)}",
        )
    return parse_llama_bench_json(proc.stdout, engine=engine)


def parse_llama_bench_json(text: str, *, engine: str = LLAMA_CPP) -> LlamaBenchResult:
    """llama-bench -o json: a list of tests with n_prompt, n_gen, samples_ts, avg_ts and the build.

    Read robustly, as the two forks differ: the first JSON list in the output is taken (log lines
    before or after it are skipped); a test is named from n_prompt and n_gen (both forks print them;
    ik_llama.cpp's `test` label is not needed); tests of other kinds (pp512+tg128) and fields Kinetic
    does not read are ignored. Anything else is a KineticError naming the fork."""
    try:
        tests = _first_json_list(text)
        best, mean, samples = {}, {}, {}
        for t in tests:
            name = _test_name(t)
            if name is None:
                continue
            runs = [float(x) for x in t.get("samples_ts") or []]
            samples[name] = runs
            mean[name] = float(t["avg_ts"])
            best[name] = max(runs or [mean[name]])
        if not best:
            raise ValueError("no pp or tg test in it")
        head = tests[0]
        return LlamaBenchResult(int(head["build_number"]), str(head["build_commit"]), best, mean, samples, engine)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise KineticError(
            f"--compare: could not read {engine}'s llama-bench JSON output ({type(exc).__name__}: {exc})",
            f"Check that the program is {engine}'s llama-bench and supports -o json; run it by hand to see its output.",
        ) from None


def _first_json_list(text: str) -> list[dict]:
    """The first JSON list of objects in `text`, whatever lines surround it."""
    decoder = json.JSONDecoder()
    for start in (m.start() for m in re.finditer(r"\[", text)):
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, list) and value and all(isinstance(t, dict) for t in value):
            return value
    raise ValueError("no JSON list of tests in the output")


def _test_name(test: dict) -> str | None:
    """pp<N> or tg<N> for a prompt or generation test, None for a test of both (pp512+tg128, tg128@pp512)."""
    n_prompt, n_gen = int(test["n_prompt"]), int(test["n_gen"])
    if n_gen == 0:
        return f"pp{n_prompt}"
    return f"tg{n_gen}" if n_prompt == 0 else None
