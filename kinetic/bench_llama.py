"""`kinetic bench --compare`: llama.cpp's llama-bench on the same file and threads.

Owns: finding llama.cpp's programs (llama-bench, and the llama-server beside it; never downloading
them), llama-bench's command line for this build, running it and parsing its JSON
(`LlamaBenchResult`).
Does not own: llama.cpp's edit test through llama-server (kinetic.bench_llama_edit), the card
(kinetic.bench_card), Kinetic's own tests, timing and table (kinetic.bench, kinetic.bench_report).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kinetic.errors import KineticError

# Where --compare looks for llama-bench after PATH (Kinetic never downloads it).
LLAMA_BENCH_PLACES = (
    Path.home() / ".cache/kinetic-ref/llama.cpp/build/bin/llama-bench",
    Path("/usr/local/bin/llama-bench"),
)


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
