"""`kinetic doctor`: one screen on what this machine offers Kinetic, then what to fix.

The system, the CPU (threads; AVX2, FMA, F16C, AVX-512, VNNI; the kernel variant used), memory, each
GPU CUDA and Vulkan report (or the device registry's reason why not), what `--device auto` picks,
the kernel cache, the models found and the free disk. Facts come from kinetic.machine and
kinetic.stores; this module only judges them (`diagnose`, a pure function of the facts, which the
tests call with made-up machines). Exit 0 when Kinetic can run here, 1 when it cannot.
"""

from __future__ import annotations

import argparse
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kinetic.cli.sizes import GiB, human
from kinetic.machine import Machine

LOW_DISK = 10 * GiB
LOW_MEMORY = 1 * GiB
# CUDA reasons that mean there is no NVIDIA GPU to use at all, rather than something to install
_NO_NVIDIA = ("no NVIDIA driver", "no CUDA GPU is visible")


@dataclass(frozen=True)
class Problem:
    what: str  # what is wrong and what to do, in one line
    fatal: bool = False  # Kinetic cannot run here until it is fixed


@dataclass(frozen=True)
class Facts:
    """Everything the doctor judges, gathered once (`gather`) or made up by a test."""

    machine: Machine
    auto_device: str  # what `--device auto` runs on, as status lines say it ("the CPU")
    cache_folder: Path
    cache_bytes: int
    cache_writable: bool
    models_folder: Path
    models_found: int
    models_runnable: int
    disk_free: int | None
    problems: list[Problem] = field(default_factory=list)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "doctor",
        help="check this machine: CPU, memory, GPUs, kernel cache, models, disk; and what to fix",
        description="One screen with the system, the CPU and its features, memory, every GPU CUDA and Vulkan "
        "report (or why not), the device --device auto picks, the kernel cache, the models found and the free "
        "disk, followed by what to fix. Exit code 0 when Kinetic can run here.",
    )
    p.set_defaults(run=run)


def gather() -> Facts:
    from kinetic import devices, stores
    from kinetic.hub import models_dir
    from kinetic.machine import disk_free, folder_size
    from kinetic.user_cache import cache_dir

    auto = devices.DEVICES[devices.resolve_device("auto", say=lambda _line: None)].label
    models = stores.discover()
    runnable = sum(stores.facts(m).runs for m in models)
    cache = cache_dir()
    folder = models_dir()
    return Facts(Machine.probe(), auto, cache, folder_size(cache), _writable(cache), folder, len(models),
                 runnable, disk_free(folder))


def _writable(folder: Path) -> bool:
    import os

    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    return existing is not None and os.access(existing, os.W_OK | os.X_OK)


def diagnose(f: Facts) -> tuple[list[str], list[Problem]]:
    """(the report's lines, the problems found, each saying what to do)."""
    m = f.machine
    problems = list(f.problems)
    lines = [f"system   {platform.system()} {platform.release()} ({platform.machine()}), Python "
             f"{platform.python_version()}"]
    if m.cpu is None:
        lines.append("cpu      unknown: the CPU kernel compiler (llvmlite) does not start")
        problems.append(Problem("the CPU kernels cannot be compiled: reinstall Kinetic's dependencies "
                                "(pip install --force-reinstall llvmlite numba)", fatal=True))
    else:
        feats = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in m.cpu.features.items())
        lines.append(f"cpu      {m.cpu.name}, {m.cpu.threads} threads, {feats}; kernels: {m.cpu.kernels}")
        if not m.cpu.features["AVX2"]:
            problems.append(Problem("the CPU has no AVX2: Kinetic runs its generic kernels, several times slower; "
                                    "a machine with AVX2 (any x86-64 CPU since 2013) runs it properly"))
    lines.append(f"memory   {human(m.memory_total)}, {human(m.memory_available)} available")
    if m.memory_available is not None and m.memory_available < LOW_MEMORY:
        problems.append(Problem(f"only {human(m.memory_available)} of memory is available: close other programs, "
                                "or use a small model and context (`kinetic fit` shows what fits)"))
    lines += _gpu_lines(m, problems)
    lines.append(f"device   --device auto runs on {f.auto_device}")
    lines.append(f"kernels  {human(f.cache_bytes)} cached in {f.cache_folder}")
    if not f.cache_writable:
        problems.append(Problem(f"the kernel cache {f.cache_folder} cannot be written, so kernels are compiled on "
                                "every run: fix its permissions, or set XDG_CACHE_HOME to a writable folder"))
    lines.append(f"models   {f.models_found} found, {f.models_runnable} that Kinetic runs (`kinetic models` lists "
                 f"them); Kinetic's folder: {f.models_folder}")
    if f.models_runnable == 0:
        problems.append(Problem("no model that Kinetic runs was found: `kinetic pull smollm2-135m` fetches a small "
                                "one, `kinetic pull org/repo` one from Hugging Face"))
    lines.append(f"disk     {human(f.disk_free)} free for {f.models_folder}")
    if f.disk_free is not None and f.disk_free < LOW_DISK:
        problems.append(Problem(f"under {LOW_DISK // GiB} GiB of disk is free where models are kept: free some, "
                                "or set KINETIC_MODELS to a folder on a larger disk"))
    return lines, problems


def _gpu_lines(m: Machine, problems: list[Problem]) -> list[str]:
    lines = []
    for gpu in m.gpus:
        memory = (f"{human(gpu.free)} of {human(gpu.total)} free" if gpu.free is not None
                  else human(gpu.total) if gpu.total else "memory unknown")
        note = " (a CPU-type device: --device cpu is faster)" if gpu.cpu_type else ""
        lines.append(f"gpu      {gpu.name} via {gpu.api}: {memory}; {gpu.detail}{note}")
    for api, why in m.gpu_problems.items():
        lines.append(f"gpu      {api}: {why}")
        if api == "CUDA" and not why.startswith(_NO_NVIDIA):
            problems.append(Problem(f"CUDA cannot be used: {why}"))
    return lines


def run(args: argparse.Namespace) -> int:
    from kinetic import __version__

    lines, problems = diagnose(gather())
    print(f"Kinetic {__version__}")
    for line in lines:
        print("  " + line)
    if problems:
        print("\nTo fix:")
        for p in problems:
            print(f"  - {p.what}" + ("  [Kinetic cannot run until this is fixed]" if p.fatal else ""))
    else:
        print("\nNothing to fix.")
    sys.stdout.flush()
    return 1 if any(p.fatal for p in problems) else 0
