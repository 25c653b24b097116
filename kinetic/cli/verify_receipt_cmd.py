"""`kinetic verify-receipt FILE [--model PATH] [--device D] [-t N] [--key PUBLIC_KEY]`.

Owns: the command line and the report, one line per check as it completes:

    receipt:   SmolLM2-135M-Instruct.Q4_1.gguf, 31 prompt and 8 output tokens, seed 42, made on ...
    signature: valid, public key 8e79e51c...
    model:     SmolLM2-135M-Instruct.Q4_1.gguf matches (BLAKE3 5f4fa13b6f0e0c3e)
    rerun:     identical, 8 of 8 output tokens on cpu-x86_64-avx2 (BLAKE3 7bd0632303b6fcbd)

The checks run in that order and the first that fails ends the command with exit 1 (the lines
before it still printed). "identical" needs the same tokens on a comparable rerun: the receipt's
Kinetic version, build, device class and device; when any differs, every one that does is named
and the command fails even if the tokens match. The checks themselves live in
kinetic.receipts.verify.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kinetic.devices import device_choices
from kinetic.errors import KineticError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "verify-receipt",
        help="rerun the answer a receipt records and check every output token",
        description="Check a receipt's token hashes and signature, then its model file's BLAKE3, then rerun "
        "the recorded prompt tokens with the recorded settings plainly (nothing drafted, nothing cached) and "
        "say whether every output token is identical. Exits with 1 when anything does not match.",
    )
    p.add_argument("receipt", help="the receipt's JSON file (kinetic run --receipt FILE)")
    p.add_argument("--model", metavar="PATH", help="the model file, when it is not at the receipt's path")
    p.add_argument("--device", choices=device_choices(auto=False),
                   help="where the rerun goes [default: the receipt's device]")
    p.add_argument("-t", "--threads", type=int, metavar="N",
                   help="CPU threads for the rerun (threads never change the bits) [default: all]")
    p.add_argument("--key", metavar="PUBLIC_KEY",
                   help="require a signature by this Ed25519 public key (64 hex digits, or a file holding them)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kinetic.ktc.keys import read_public_key
    from kinetic.receipts import read_receipt, signature_valid
    from kinetic.receipts import verify as v
    from kinetic.receipts.receipt import summary

    if args.threads is not None and args.threads <= 0:
        raise KineticError(f"-t must be positive, not {args.threads}", "Give a thread count such as -t 4.")
    expected = read_public_key(args.key) if args.key else None
    path = Path(args.receipt)
    receipt = read_receipt(path)
    _say("receipt", summary(receipt))
    problems = v.token_problems(receipt)
    if problems:
        raise KineticError(f"{path.name}: {'; '.join(problems)}",
                           "The receipt was changed after it was made; it proves nothing.")
    valid = signature_valid(receipt)
    public = receipt["signature"]["public_key"] if valid is not None else None
    _say("signature", "none (unsigned)" if valid is None else
         f"{'valid' if valid else 'INVALID'}, public key {public}")
    if valid is False:
        raise KineticError(f"{path.name}: the signature does not match the receipt",
                           "The receipt was changed after it was signed, or signed with another key.")
    if expected is not None and public != expected.hex():
        who = "is unsigned" if public is None else f"is signed by {public}"
        raise KineticError(f"{path.name} {who}, not by {expected.hex()}",
                           "Get the receipt from the signer whose key you trust.")
    model_path = v.find_model(receipt, path, args.model)
    same, digest = v.model_matches(receipt, model_path)
    if not same:
        what = f"BLAKE3 {digest[:16]}" if digest else f"{model_path.stat().st_size} bytes"
        _say("model", f"{model_path.name} DIFFERS ({what}; the receipt's {receipt['model']['blake3'][:16]})")
        raise KineticError(f"{model_path} is not the receipt's model file",
                           "Give the receipt's model with --model PATH.")
    _say("model", f"{model_path.name} matches (BLAKE3 {digest[:16]})")
    result = v.rerun(receipt, model_path, device=args.device or v.receipt_device(receipt), threads=args.threads)
    return _report_rerun(path, receipt, result)


def _report_rerun(path: Path, receipt: dict, result) -> int:
    """The rerun's line, then every recorded fact that differs; 0 only for identical tokens on a
    comparable rerun (the receipt's version, build, device class and device)."""
    from kinetic.receipts import verify as v

    difference = v.difference(receipt, result)
    reasons = v.what_differs(receipt, result)
    n = len(result.tokens)
    if difference is None and not reasons:
        _say("rerun", f"identical, {n} of {n} output tokens on {result.device_class} "
             f"(BLAKE3 {receipt['output']['tokens']['blake3'][:16]})")
        return 0
    if difference is None:
        _say("rerun", f"the same {n} of {n} output tokens on {result.device_class}, but not comparable: "
             "it was not made the way the receipt records")
        _say("differs", "; ".join(reasons))
        raise KineticError(f"{path.name}: the rerun reproduces the tokens, but not on the receipt's "
                           f"{_facts(reasons)}, so it does not confirm the receipt",
                           "Bits are promised only within one build and one device class: rerun with the "
                           "receipt's build and device class to confirm it.")
    _say("rerun", difference)
    _say("", "what differs: " + "; ".join(reasons) if reasons else
         "the build, the device class and the settings are the receipt's")
    hint = ("A different build or device class may round differently; rerun with the receipt's."
            if reasons else "Same build, class and settings give the same tokens: the receipt was changed, or "
            "this is a bug in Kinetic worth reporting.")
    raise KineticError(f"{path.name}: the rerun does not reproduce the receipt's output", hint)


def _facts(reasons: list[str]) -> str:
    """"build and device class" from what_differs' lines."""
    names = [r.split(" (")[0] for r in reasons]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _say(label: str, text: str) -> None:
    print(f"{label + ':' if label else '':<11}{text}", flush=True)
