"""Checking a receipt: its token hashes, its signature, its model file, then a plain rerun.

Owns: each check as a function returning what it found, and the rerun: the recorded prompt ids with
the recorded settings, one sequence, nothing drafted (Model(draft=False): RAD-1 off), nothing cached
(warm_start=False). Does not own the command line or printing (kinetic/cli/verify_receipt_cmd.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kinetic.errors import KineticError
from kinetic.receipts.hashing import build_hash, file_blake3, token_hash
from kinetic.receipts.receipt import device_class_of, options_from_settings, settings_from_receipt


def token_problems(receipt: dict[str, Any]) -> list[str]:
    """Each token list whose count or BLAKE3 does not match its ids, named."""
    problems = []
    for name, record in (("prompt", receipt["prompt"]), ("output", receipt["output"]["tokens"])):
        if record["count"] != len(record["ids"]):
            problems.append(f"{name} count is {record['count']} but it lists {len(record['ids'])} ids")
        elif record["blake3"] != token_hash(record["ids"]):
            problems.append(f"{name} token ids do not match their BLAKE3")
    return problems


def receipt_device(receipt: dict[str, Any]) -> str:
    """The device a rerun goes to by default: the one the receipt's class names."""
    return "reference" if receipt["device"]["class"].startswith("reference") else "cpu"


def find_model(receipt: dict[str, Any], receipt_path: Path, given: str | None) -> Path:
    """--model when given; else the recorded path, else the recorded file name beside the receipt,
    else a downloaded model of that file name."""
    if given is not None:
        from kinetic.hub import resolve_model

        return resolve_model(given)
    recorded = receipt["model"]
    for candidate in (_expanded(recorded["path"]), receipt_path.parent / recorded["file"]):
        if candidate is not None and candidate.is_file():
            return candidate
    from kinetic.hub import models_dir

    downloaded = models_dir() / recorded["file"]
    if downloaded.is_file():
        return downloaded
    raise KineticError(f"the receipt's model {recorded['path']} is not here",
                       "Give its path with --model PATH.")


def _expanded(recorded: str) -> Path | None:
    """The recorded path with ~ expanded; None when it names a home folder this machine lacks."""
    try:
        return Path(recorded).expanduser()
    except RuntimeError:
        return None


def model_matches(receipt: dict[str, Any], path: Path) -> tuple[bool, str]:
    """Whether the file is the receipt's (size, then BLAKE3 from the hash cache), and its hash."""
    recorded = receipt["model"]
    if os.path.getsize(path) != recorded["size"]:
        return False, ""
    digest = file_blake3(path)
    return digest == recorded["blake3"], digest


@dataclass
class Rerun:
    tokens: list[int]
    finish: str
    text: str
    device_class: str
    build: str
    version: str = ""
    device_name: str = ""
    pieces: dict[int, str] = field(default_factory=dict)  # the text of the tokens a report names


def rerun(receipt: dict[str, Any], path: Path, *, device: str, threads: int | None) -> Rerun:
    """The recorded prompt ids decoded plainly with the recorded settings, for at most one token more
    than the receipt lists (enough to see an answer the receipt cut short)."""
    from kinetic import __version__
    from kinetic.devices import DEVICE_NAMES
    from kinetic.model import Model

    sampling, max_tokens = settings_from_receipt(receipt)
    settings = receipt["device"]["settings"]
    recorded = receipt["output"]["tokens"]["ids"]
    limit = len(recorded) + 1 if max_tokens is None else min(max_tokens, len(recorded) + 1)
    model = Model(path, n_ctx=settings["ctx-size"], device=device, threads=threads,
                  options=options_from_settings(settings), draft=False, warm_start=False,
                  lora=recorded_adapters(receipt))
    text = model.generate(receipt["prompt"]["ids"], max_tokens=limit, sampling=sampling)
    stats = model.last_stats
    result = Rerun(list(stats.tokens), stats.stop_reason, text, device_class_of(device), build_hash(), __version__,
                   DEVICE_NAMES.get(device, device))
    at = first_difference(recorded, result.tokens)
    for token in ([recorded[at]] if at < len(recorded) else []) + ([result.tokens[at]] if at < len(result.tokens)
                                                                       else []):
        result.pieces[token] = model.detokenize([token])
    return result


def recorded_adapters(receipt: dict[str, Any]) -> list:
    """The receipt's LoRA adapters (model.adapters: file, path, blake3, scale), each file found at its
    recorded path and checked against its BLAKE3; a KineticError when one is missing or differs."""
    from kinetic.lora import Adapter

    adapters = []
    for item in receipt["model"].get("adapters", []):
        if not (isinstance(item, dict) and isinstance(item.get("path"), str) and isinstance(item.get("blake3"), str)
                and isinstance(item.get("scale"), (int, float)) and not isinstance(item.get("scale"), bool)):
            raise KineticError("the receipt's model.adapters is not a list of {file, path, blake3, scale}",
                               "The receipt is damaged or was not written by Kinetic.")
        path = _expanded(item["path"])
        if path is None or not path.is_file() or file_blake3(path) != item["blake3"]:
            raise KineticError(f"the LoRA adapter {item['path']} the answer was made with is missing or changed",
                               "Put the adapter file the receipt names (its BLAKE3 must match) at that path.")
        adapters.append(Adapter(path, float(item["scale"])))
    return adapters


def first_difference(a: list[int], b: list[int]) -> int:
    """The index of the first token where a and b differ (len of the shorter when one extends the other)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def what_differs(receipt: dict[str, Any], result: Rerun) -> list[str]:
    """Every recorded fact about how the answer was made that differs between the receipt and the
    rerun: the Kinetic version, the build, the device class and the device's name. (The model file
    is refused before any rerun when it differs; the prompt ids and every setting are the receipt's
    own, used as recorded.) Empty: the rerun is comparable, bit for bit."""
    rerun_facts = {("kinetic", "version"): ("Kinetic version", result.version),
                   ("kinetic", "build"): ("build", result.build),
                   ("device", "class"): ("device class", result.device_class),
                   ("device", "name"): ("device", result.device_name)}
    found = []
    for (group, key), (label, ours) in rerun_facts.items():
        theirs = receipt[group][key]
        if theirs != ours:
            found.append(f"{label} (receipt {theirs}, rerun {ours})")
    return found


def difference(receipt: dict[str, Any], result: Rerun) -> str | None:
    """None when the rerun reproduces the receipt's output; else where and how it differs."""
    recorded = receipt["output"]["tokens"]["ids"]
    at = first_difference(recorded, result.tokens)
    if at < len(recorded) and at < len(result.tokens):
        theirs, ours = recorded[at], result.tokens[at]
        return (f"differs at output token {at + 1} of {len(recorded)}: the receipt has {theirs} "
                f"{result.pieces.get(theirs, '')!r}, the rerun {ours} {result.pieces.get(ours, '')!r}")
    if at < len(recorded):
        return (f"the rerun ends ({result.finish}) after {at} of the receipt's {len(recorded)} output tokens; "
                f"the receipt goes on with {recorded[at]} {result.pieces.get(recorded[at], '')!r}")
    if at < len(result.tokens):
        extra = result.tokens[at]
        return (f"the rerun goes on after the receipt's {len(recorded)} output tokens with {extra} "
                f"{result.pieces.get(extra, '')!r}; the receipt ends there ({receipt['output']['finish']})")
    if result.finish != receipt["output"]["finish"]:
        return (f"the {len(recorded)} output tokens are identical, but the answer ends with finish "
                f"{result.finish!r}, the receipt says {receipt['output']['finish']!r}")
    if result.text != receipt["output"]["text"]:
        return f"the {len(recorded)} output tokens are identical, but their text is not the receipt's text"
    return None
