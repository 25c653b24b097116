"""`kinetic fit [MODEL|DIR]`: for each model, the largest context this machine's memory holds and,
with a GPU, how many layers go there.

The estimate and its formula live in kinetic.fit (docs/models.md states it); the memory figures
come from kinetic.machine, or from --memory / --gpu-memory to plan for another machine. Reads only
file headers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kinetic.cli.sizes import gib_argument, human


def add_parser(sub) -> None:
    p = sub.add_parser(
        "fit",
        help="which models, contexts and GPU layers fit this machine's memory",
        description="For every model `kinetic models` lists, or the one or the folder given: the largest "
        "context that fits the free memory (weights + KV cache per token + working buffers) and, on a GPU, "
        "how many layers fit its free memory. Reads only file headers.",
    )
    p.add_argument("model", nargs="?", help="a model (file or name) or a folder of .gguf files [default: all found]")
    p.add_argument("--memory", type=gib_argument, metavar="GIB", help="plan for this much RAM (GiB) instead of "
                   "what is available now")
    p.add_argument("--gpu-memory", type=gib_argument, metavar="GIB", help="plan for a GPU with this much free "
                   "memory (GiB) instead of this machine's")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(run=run)


def models_to_fit(spec: str | None) -> list[tuple[str, Path, int]]:
    """(name, file, size) of each model: all found, every model below a folder, or the one named."""
    from kinetic import stores
    from kinetic.stores.layouts import flat_files

    if spec is None:
        return [(m.name, m.path, m.size) for m in stores.discover()]
    folder = Path(spec).expanduser()
    if folder.is_dir():
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        return [(m.name, m.path, m.size) for m in flat_files(files, "folder")]
    from kinetic.hub import resolve_model

    path = resolve_model(spec)
    return [(spec, path, path.stat().st_size)]


def plan_rows(models: list[tuple[str, Path, int]], *, memory: int | None, gpu_memory: int | None) -> list[dict]:
    from kinetic import fit

    rows = []
    for name, path, size in models:
        row = {"name": name, "path": str(path), "size": size}
        shape, why = fit.shape_or_reason(path)
        if shape is None or memory is None:
            rows.append({**row, "runs_on": "-", "why_not": why or "this system does not report its memory"})
            continue
        p = fit.plan(shape, memory=memory, gpu_memory=gpu_memory)
        rows.append({**row, "kv_per_token": shape.kv_per_token, "working": shape.working,
                     "weights": shape.weights, "training_context": shape.context_length,
                     "max_context": p.max_context, "context": p.context, "gpu_layers": p.gpu_layers,
                     "layers": shape.n_layer, "runs_on": p.runs_on, "why_not": None})
    return rows


def format_table(rows: list[dict], heading: str) -> str:
    lines = [heading, f"{'MODEL':<44} {'SIZE':>10} {'KV/TOKEN':>10} {'MAX CONTEXT':>12}  RUNS ON"]
    for r in rows:
        if r["why_not"]:
            lines.append(f"{r['name']:<44} {human(r['size']):>10} {'-':>10} {'-':>12}  no: {r['why_not']}")
            continue
        kv = f"{r['kv_per_token'] / 1024:.1f} KiB"
        runs = r["runs_on"] if r["gpu_layers"] is None else f"{r['runs_on']} (at {r['context']} tokens)"
        lines.append(f"{r['name']:<44} {human(r['size']):>10} {kv:>10} {r['max_context']:>12}  {runs}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    models = models_to_fit(args.model)
    memory, gpu_memory, heading = _figures(args)
    rows = plan_rows(models, memory=memory, gpu_memory=gpu_memory)
    if args.json:
        print(json.dumps({"memory": memory, "gpu_memory": gpu_memory, "models": rows}, indent=2))
    elif not rows:
        print("no GGUF models found; `kinetic models` says where it looks")
    else:
        print(format_table(rows, heading))
    return 0


def _figures(args) -> tuple[int | None, int | None, str]:
    """(RAM, GPU memory, a line saying what they are): the flags, else what this machine has now."""
    machine = None
    if args.memory is None or args.gpu_memory is None:
        from kinetic.machine import Machine

        machine = Machine.probe()
    memory = args.memory if args.memory is not None else machine.memory_available
    heading = f"memory: {human(memory)} " + ("(given)" if args.memory is not None else "available")
    if args.gpu_memory is not None:
        return memory, args.gpu_memory, heading + f"; GPU: {human(args.gpu_memory)} (given)"
    gpu = machine.plan_gpu
    if gpu is None:
        return memory, None, heading + "; GPU: none usable"
    free = gpu.free or gpu.total
    return memory, free, heading + f"; GPU: {gpu.name}, {human(free)} {'free' if gpu.free else 'in all'}"
