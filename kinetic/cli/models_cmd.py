"""`kinetic models [--json]`: the GGUF models already on this computer and whether Kinetic runs them.

Lists Kinetic's folder, Ollama's, LM Studio's, the Hugging Face cache and llama.cpp's cache
(kinetic.stores), reading only each file's header. Every command takes the NAME shown in place of a
file.
"""

from __future__ import annotations

import argparse
import json

from kinetic.cli.sizes import human

SOURCES = {"kinetic": "kinetic", "ollama": "ollama", "lmstudio": "lm studio", "huggingface": "hf cache",
           "llama.cpp": "llama.cpp"}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "models",
        help="list the GGUF models on this computer (Kinetic's, Ollama's, LM Studio's, Hugging Face's, llama.cpp's)",
        description="List the GGUF models already on this computer: Kinetic's models folder (KINETIC_MODELS), "
        "Ollama's (OLLAMA_MODELS), LM Studio's, the Hugging Face cache (HF_HUB_CACHE, HF_HOME) and llama.cpp's "
        "cache (LLAMA_CACHE), with size, quantization, architecture and whether Kinetic runs them. Every "
        "command takes a NAME from this list in place of a file.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object per model, in a list")
    p.set_defaults(run=run)


def rows(where=None) -> list[dict]:
    """One dict per model: name, size, quant, arch, runs, why_not, source, path."""
    from kinetic import stores

    out = []
    for model in stores.discover(where):
        facts = stores.facts(model)
        out.append({"name": model.name, "size": model.size, "quant": facts.quant,
                    "arch": facts.architecture, "runs": facts.runs, "why_not": facts.why_not,
                    "context_length": facts.context_length, "source": model.source, "path": str(model.path),
                    "parts": [str(p) for p in model.parts]})
    return out


def format_table(models: list[dict]) -> str:
    # the seed's columns, with FROM before RUNS ON KINETIC so that a reason of any length ends the line
    lines = [f"{'NAME':<44} {'SIZE':>10}  {'QUANT':<9} {'ARCH':<12} {'FROM':<10} RUNS ON KINETIC"]
    for m in models:
        runs = "yes" if m["runs"] else f"no: {m['why_not']}"
        lines.append(f"{m['name']:<44} {human(m['size']):>10}  {m['quant'] or '-':<9} {m['arch'] or '-':<12} "
                     f"{SOURCES.get(m['source'], m['source']):<10} {runs}")
    runnable = sum(m["runs"] for m in models)
    lines.append(f"{len(models)} found, {runnable} that Kinetic runs")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    models = rows()
    if args.json:
        print(json.dumps(models, indent=2, ensure_ascii=False))
    elif not models:
        from kinetic.stores import Locations

        where = Locations.from_environment()
        print("no GGUF models found in " + ", ".join(
            str(p) for p in (where.kinetic, *where.ollama, *where.lmstudio, where.huggingface, where.llama_cpp)))
        print("Get one with `kinetic pull smollm2-135m` or `kinetic pull org/repo`.")
    else:
        print(format_table(models))
    return 0
