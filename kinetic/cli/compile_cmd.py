"""`kinetic compile MODEL [-o OUT.ktc [--force]] [--device cpu] [--tune [--tune-seconds N]] [--sign-key FILE]
[--dump-ir DIR] [--numerics {ggml,fast}]`.

Owns: the command line of compile and its summary (nodes and time per phase). The work itself is
kinetic.compiler's `compile_graph` (lowering, then the pass pipeline) and, with `-o`, kinetic.ktc's `build_ktc`, which
writes the .ktc file (weights, tokenizer, chat template, graph, default profile, metadata; signed
with --sign-key). `--tune` measures the profile's threads, batch and matmul kernels on this
machine first (kinetic.ktc.tune, at most --tune-seconds, default 120; every candidate's logits checked
bit for bit) and writes them with `"tuned": true`.
`--dump-ir DIR` writes the graph after each phase in the IR's text form: `00-lowered.ir`,
`01-canonicalize.ir`, ...; for a device that has a device phase (`--device cpu`, the default: its
shared quantize nodes; cuda: its fusions), that phase comes last (`NN-device.ir`: the graph the
device's runner runs). The .ktc file holds the generic graph whatever the device, with its
reductions in the orders of the numerics mode `--numerics` chose (recorded in its metadata).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kinetic.cli.runtime_options import add_numerics_arg
from kinetic.devices import device, device_choices
from kinetic.errors import KineticError

_DUMP_NAME = re.compile(r"\d\d-[a-z_]+\.ir")
DEFAULT_TUNE_SECONDS = 120.0


@dataclass(frozen=True)
class PhaseReport:
    name: str
    nodes: int
    seconds: float


def add_parser(sub) -> None:
    p = sub.add_parser(
        "compile",
        help="lower a model to the graph IR, optimize it, and write a .ktc file (-o)",
        description="Lower a GGUF model to Kinetic's graph IR and run the pass pipeline. With -o, write a "
        ".ktc file (docs/FORMAT.md); with --dump-ir, write the graph after each phase as text.",
    )
    p.add_argument("model", help="path to a .gguf file, or the short name of a downloaded model")
    p.add_argument("-o", "--output", metavar="OUT", help="the .ktc file to write (never over an existing file)")
    p.add_argument("--force", action="store_true", help="replace OUT when it exists (never the model or the key)")
    p.add_argument("--device", choices=device_choices(auto=False), default="cpu",
                   help="the device: --dump-ir shows its device phase; -o's profile is for it (cpu only) "
                   "[default: cpu]")
    p.add_argument("--sign-key", metavar="FILE", help="sign the .ktc file with this Ed25519 secret key file")
    p.add_argument("--tune", action="store_true",
                   help="measure the fastest threads, batch and matmul kernels on this machine for the profile "
                   "(needs -o)")
    p.add_argument("--tune-seconds", type=float, metavar="N",
                   help=f"the most seconds --tune measures for [default: {DEFAULT_TUNE_SECONDS:.0f}]")
    p.add_argument("--dump-ir", metavar="DIR", help="write the graph after each phase to DIR as NN-PHASE.ir")
    add_numerics_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    usage = _tune_usage(args) or _device_usage(args)
    if usage:
        sys.stderr.write(f"kinetic: {usage}\nRun `kinetic compile --help` for the options.\n")
        return 2
    from kinetic.hub import resolve_model

    path = resolve_model(args.model)
    out = _check_output(Path(args.output), path, args) if args.output else None
    key = None
    if args.sign_key:
        from kinetic.ktc.keys import read_signing_key

        key = read_signing_key(args.sign_key)
    dump_dir = _prepare_dump_dir(Path(args.dump_ir)) if args.dump_ir else None
    graphs: list = []
    capabilities = device(args.device).capabilities
    fusions = capabilities().fusions if capabilities is not None else None
    options = _options(args)
    reports = compile_model(path, dump_dir=dump_dir, keep=graphs, fusions=fusions, options=options)
    print(format_summary(path, reports, dump_dir=dump_dir, fusions=fusions, numerics=options.numerics))
    if out is not None:
        profile = _tune(path, graphs[-1], args) if args.tune else None
        print(_write_ktc(path, graphs[-1], out, device=args.device, key=key, profile=profile, force=args.force,
                         options=options))
    return 0


def _options(args: argparse.Namespace):
    """The lowering options compile uses: the defaults, in the numerics mode --numerics asks for where
    --device follows it (kinetic/numerics_mode.py: else ggml, with a note)."""
    from kinetic.frontend.blocks import Options
    from kinetic.ktc.load import stderr_note
    from kinetic.numerics_mode import choose_numerics

    return Options(numerics=choose_numerics(requested=args.numerics, stored=None, device=args.device,
                                            note=stderr_note))


def _tune_usage(args: argparse.Namespace) -> str | None:
    """What is wrong with the --tune flags, or None."""
    if args.tune and not args.output:
        return "--tune measures the profile a .ktc file holds; give -o MODEL.ktc"
    if args.tune_seconds is not None and not args.tune:
        return "--tune-seconds limits --tune; add --tune"
    if args.tune_seconds is not None and not args.tune_seconds > 0:
        return f"--tune-seconds must be more than 0, not {args.tune_seconds}"
    return None


def _device_usage(args: argparse.Namespace) -> str | None:
    """What is wrong with --device for -o, or None: a .ktc profile is for the CPU so far."""
    if args.output and args.device != "cpu":
        return (f"a .ktc file's profile is for --device cpu; --device {args.device} shows its device phase "
                "with --dump-ir")
    return None


def _tune(path: Path, graph, args: argparse.Namespace):
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.ktc.tune import summary, tune
    from kinetic.runtime.weights import GGUFWeights

    seconds = args.tune_seconds or DEFAULT_TUNE_SECONDS
    profile = tune(graph, GGUFWeights(open_gguf(path)), seconds=seconds, device=args.device)
    print(summary(profile))
    return profile


def _check_output(out: Path, source: Path, args: argparse.Namespace) -> Path:
    """The output path, refused before compiling when it exists (without --force), is an input or
    is not a .ktc name (kinetic.outputs)."""
    from kinetic.ktc import is_ktc
    from kinetic.outputs import check_output

    if is_ktc(source):
        raise KineticError(f"{source.name} is a .ktc file already", "Compile the .gguf file it was made from.")
    if out.suffix.lower() != ".ktc":
        raise KineticError(f"the output {out} does not end in .ktc", "Name the output file MODEL.ktc.")
    return check_output(out, inputs={"the model file": source, "the --sign-key file": args.sign_key},
                        force=args.force)


def _write_ktc(path: Path, graph, out: Path, *, device: str, key, profile=None, force: bool = False,
               options=None) -> str:
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.ktc.build import build_ktc

    start = time.perf_counter()
    entries = build_ktc(open_gguf(path), graph, out, device=device, signing_key=key, profile=profile,
                        overwrite=force, options=options)
    size = out.stat().st_size
    signed = f", signed by {bytes(key.verify_key).hex()}" if key is not None else ", unsigned"
    return (f"  wrote {out} ({size / 2**20:.1f} MiB, {len(entries)} sections{signed}) "
            f"in {time.perf_counter() - start:.2f} s")


def compile_model(path: Path, *, dump_dir: Path | None = None, keep: list | None = None,
                  fusions=None, options=None) -> list[PhaseReport]:
    """Lower the model with the lowering `options` (None: the defaults) and run the pipeline, then with a
    device's `fusions` (kinetic.passes.Fusions) its device phase; one report per phase, starting with
    `lowered`. The generic graph (what a .ktc file stores) is appended to `keep` when given."""
    from kinetic.compiler import compile_graph
    from kinetic.frontend.gguf_file import open_gguf

    reports: list[PhaseReport] = []
    clock = [time.perf_counter()]

    def on_phase(name: str, graph) -> None:
        now = time.perf_counter()
        reports.append(PhaseReport(name, len(graph.nodes), now - clock[0]))
        if dump_dir is not None:
            _dump(dump_dir, index=len(reports) - 1, name=name, graph=graph)
        clock[0] = time.perf_counter()

    graph = compile_graph(open_gguf(path), options, on_phase=on_phase)
    if keep is not None:
        keep.append(graph)
    if fusions is not None:
        from kinetic.passes import lower_for_device

        lower_for_device(graph, fusions, on_phase=on_phase)
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


def format_summary(path: Path, reports: list[PhaseReport], *, dump_dir: Path | None, fusions=None,
                   numerics: str | None = None) -> str:
    from kinetic.compiler import pass_options
    from kinetic.frontend.blocks import Options
    from kinetic.passes import pipeline_hash

    width = max([14] + [len(r.name) + 2 for r in reports])  # batch_invariance is 16 characters
    lines = [f"compiled {path.name}", f"  {'phase':<{width}}{'nodes':>7}{'time':>11}"]
    lines += [f"  {r.name:<{width}}{r.nodes:>7}{r.seconds * 1000:>8.1f} ms" for r in reports]
    total = sum(r.seconds for r in reports[1:])
    passes = pass_options(Options(numerics=numerics))
    lines.append(f"  passes took {total * 1000:.1f} ms; pipeline {pipeline_hash(passes, fusions=fusions)[:16]}; "
                 f"numerics {passes.numerics}")
    if dump_dir is not None:
        lines.append(f"  IR of each phase written to {dump_dir}/")
    return "\n".join(lines)
