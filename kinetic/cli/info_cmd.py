"""`kinetic info MODEL [--json]`: what a GGUF file holds, from its header only.

Reads no tensor data and imports nothing heavy (no compiler, no kernels), so it answers at once
even for a file of many gigabytes. The facts and their layout live in kinetic.frontend.model_info.
"""

from __future__ import annotations

import argparse
import json


def add_parser(sub) -> None:
    p = sub.add_parser(
        "info",
        help="show what a GGUF or .ktc model file holds (from its header only)",
        description="Show a model's name, architecture and whether Kinetic supports it, size and "
        "parameter count, context length, layers and width, whether it has a prediction block, its "
        "weight types, tokenizer and chat template. Reads only the file's header.",
    )
    p.add_argument("model", help="path to a .gguf or .ktc file, or the short name of a downloaded model")
    p.add_argument("--json", action="store_true", help="print the same facts as one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kinetic.frontend.model_info import format_text, read_model_info, to_json
    from kinetic.hub import resolve_model
    from kinetic.ktc import is_ktc

    path = resolve_model(args.model)
    if is_ktc(path):  # a .ktc file: the same facts from its sections, then the file's own (kinetic/ktc/info.py)
        from kinetic.ktc.info import format_ktc_rows, read_ktc_info

        info, facts = read_ktc_info(path)
        report = {**to_json(info), "ktc": facts}
        print(json.dumps(report, indent=2, ensure_ascii=False) if args.json else
              format_text(info) + "\n" + format_ktc_rows(facts))
        return 0
    info = read_model_info(path)
    if args.json:
        print(json.dumps(to_json(info), indent=2, ensure_ascii=False))
    else:
        print(format_text(info))
    return 0
