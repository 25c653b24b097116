"""`kinetic info MODEL [--json]`: what a GGUF file holds, from its header only.

Reads no weights (at most the few values of a rope_freqs tensor, for the rotary row) and imports
nothing heavy (no compiler, no kernels), so it answers at once even for a file of many gigabytes.
The header's facts and their layout live in kinetic.frontend.model_info; the rows after them are
the model family's own facts (its descriptor's `facts` hook: heads, rotary, norms, multipliers,
windows), shown for a supported architecture. A value the family refuses shows as one
`family facts` row naming it, and the rest of the report still prints.
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
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.frontend.model_info import describe, format_text, to_json
    from kinetic.hub import resolve_model
    from kinetic.ktc import is_ktc

    path = resolve_model(args.model)
    if is_ktc(path):  # a .ktc file: the same facts from its sections, then the file's own (kinetic/ktc/info.py)
        from kinetic.ktc.info import format_ktc_rows, read_ktc_info
        from kinetic.ktc.load import LoadedKtc

        info, ktc_facts = read_ktc_info(path)
        facts = family_facts(LoadedKtc(path, hash_weights=False).gguf, info.supported)
        report = {**to_json(info), "facts": facts, "ktc": ktc_facts}
        print(json.dumps(report, indent=2, ensure_ascii=False) if args.json else
              "\n".join([format_text(info), *format_facts(facts), format_ktc_rows(ktc_facts)]))
        return 0
    gguf = open_gguf(path)
    info = describe(gguf)
    facts = family_facts(gguf, info.supported)
    if args.json:
        print(json.dumps({**to_json(info), "facts": facts}, indent=2, ensure_ascii=False))
    else:
        print("\n".join([format_text(info), *format_facts(facts)]))
    return 0


def family_facts(gguf, supported: bool) -> dict[str, str]:
    """The family's facts about the file (label -> text); {} for an architecture no family answers
    to; one "family facts" entry with the reason when the family refuses a value of the file."""
    from kinetic.errors import KineticError
    from kinetic.frontend.families import family_for

    if not supported:
        return {}
    try:
        return family_for(gguf.architecture).facts(gguf)
    except KineticError as exc:
        return {"family facts": f"unreadable: {exc.message}"}


def format_facts(facts: dict[str, str]) -> list[str]:
    from kinetic.frontend.model_info import LABEL_WIDTH

    return [f"  {label:<{LABEL_WIDTH}}{value}" for label, value in facts.items()]
