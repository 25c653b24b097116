"""`kinetic compile MODEL [-o OUT] [--dump-ir DIR]`: lower a model and run the pass pipeline.

Owns: the command line of compile and its summary (nodes and time per phase). The work itself is
the frontend's `lower` and the passes' `run_pipeline`. Writing .ktc files is a later issue: `-o`
is refused with a clear message until then. `--dump-ir DIR` writes the graph after each phase in
the IR's text form: `00-lowered.ir`, `01-canonicalize.ir`, ...
"""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass
from pathlib import Path

from kinetic.errors import KineticError

_DUMP_NAME = re.compile(r"\d\d-[a-z_]+\.ir")


@dataclass(frozen=True)
class PhaseReport:
    name: str
    nodes: int
    seconds: float


def add_parser(sub) -> None:
    p = sub.add_parser(
        "compile",
        help="lower a model to the graph IR and optimize it",
        description="Lower a GGUF model to Kinetic's graph IR and run the pass pipeline. "
        "With --dump-ir, write the graph after each phase as text.",
    )
    p.add_argument("model", help="path to a .gguf file, or the short name of a downloaded model")
    p.add_argument("-o", "--output", metavar="OUT", help="the .ktc file to write (not available yet)")
    p.add_argument("--dump-ir", metavar="DIR", help="write the graph after each phase to DIR as NN-PHASE.ir")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.output:
        raise KineticError(
            "writing .ktc files is not available yet",
            "Run `kinetic compile MODEL --dump-ir DIR` to see the optimized graph for now.",
        )
    from kinetic.hub import resolve_model

    path = resolve_model(args.model)
    dump_dir = _prepare_dump_dir(Path(args.dump_ir)) if args.dump_ir else None
    reports = compile_model(path, dump_dir=dump_dir)
    print(format_summary(path, reports, dump_dir=dump_dir))
    return 0


def compile_model(path: Path, *, dump_dir: Path | None = None) -> list[PhaseReport]:
    """Lower the model and run the pipeline; one report per phase, starting with `lowered`."""
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.frontend.lower import lower
    from kinetic.passes import run_pipeline

    reports: list[PhaseReport] = []
    clock = [time.perf_counter()]

    def on_phase(name: str, graph) -> None:
        now = time.perf_counter()
        reports.append(PhaseReport(name, len(graph.nodes), now - clock[0]))
        if dump_dir is not None:
            _dump(dump_dir, index=len(reports) - 1, name=name, graph=graph)
        clock[0] = time.perf_counter()

    graph = lower(open_gguf(path))
    on_phase("lowered", graph)
    run_pipeline(graph, on_phase=on_phase)
    return reports


def _prepare_dump_dir(directory: Path) -> Path:
    """Create DIR; remove the phase files an earlier dump left there (and nothing else)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KineticError(f"cannot create {directory}: {exc.strerror}", "Choose another --dump-ir folder.") from None
    for old in directory.iterdir():
        if _DUMP_NAME.fullmatch(old.name) and old.is_file():
            old.unlink()
    return directory


def _dump(directory: Path, *, index: int, name: str, graph) -> None:
    from kinetic.ir.text import print_graph

    (directory / f"{index:02d}-{name}.ir").write_text(print_graph(graph), encoding="utf-8")


def format_summary(path: Path, reports: list[PhaseReport], *, dump_dir: Path | None) -> str:
    from kinetic.passes import pipeline_hash

    lines = [f"compiled {path.name}", f"  {'phase':<14}{'nodes':>7}{'time':>11}"]
    lines += [f"  {r.name:<14}{r.nodes:>7}{r.seconds * 1000:>8.1f} ms" for r in reports]
    total = sum(r.seconds for r in reports[1:])
    lines.append(f"  passes took {total * 1000:.1f} ms; pipeline {pipeline_hash()[:16]}")
    if dump_dir is not None:
        lines.append(f"  IR of each phase written to {dump_dir}/")
    return "\n".join(lines)
