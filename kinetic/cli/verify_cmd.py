"""`kinetic verify MODEL.ktc [--key PUBLIC_KEY]`: recheck every byte of a .ktc file.

Owns: the command line and the report. The checks are kinetic.ktc.reader's: the structure (header,
manifest, placement, zero padding) and the signature when the file is opened, then the BLAKE3 of
every section, all of them reported before failing. Exit 1 names what does not match; with --key,
a file that is unsigned or signed by another key fails too.
"""

from __future__ import annotations

import argparse

from kinetic.errors import KineticError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "verify",
        help="recheck every hash of a .ktc file and report its signature",
        description="Recompute the BLAKE3 hash of every section of a .ktc file, check its structure and "
        "zero padding, and report whether it is signed and by which public key. Exits with 1 when "
        "anything does not match.",
    )
    p.add_argument("model", help="the .ktc file")
    p.add_argument("--key", metavar="PUBLIC_KEY",
                   help="require a signature by this Ed25519 public key (64 hex digits, or a file holding them)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kinetic.hub import resolve_model
    from kinetic.ktc import KtcFile
    from kinetic.ktc.keys import read_public_key

    expected = read_public_key(args.key) if args.key else None
    ktc = KtcFile.open(resolve_model(args.model))
    print(f"{ktc.path.name}: .ktc format {ktc.header.version}, {len(ktc.entries)} sections, "
          f"{_size(ktc.file_size)}")
    bad = []
    for kind, entry in ktc.entries.items():
        ok = ktc.compute_hash(kind) == entry.digest
        bad += [] if ok else [kind.label]
        print(f"  {kind.label:<14}{_size(entry.size):>11}  {'ok' if ok else 'MISMATCH':<8} blake3 {entry.digest.hex()}")
    sig = ktc.signature
    print(f"  {'signature':<14}" + (f"valid, public key {sig.public_key_hex}" if sig else "none (unsigned)"))
    if bad:
        raise KineticError(f"{ktc.path.name}: section {', '.join(bad)} does not match its BLAKE3 hash in the "
                           "manifest", "The file was changed or damaged after it was written; do not use it.")
    if expected is not None and (sig is None or sig.public_key != expected):
        who = "is unsigned" if sig is None else f"is signed by {sig.public_key_hex}"
        raise KineticError(f"{ktc.path.name} {who}, not by {expected.hex()}",
                           "Get the file from the publisher whose key you trust.")
    print("every hash matches" + (", signed by the expected key" if expected is not None else ""))
    return 0


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KiB" if n < 1024**2 else f"{n / 1024**2:.1f} MiB"
