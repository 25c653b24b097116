"""`kinetic keygen FILE [--force]`: make an Ed25519 key to sign .ktc files with (`kinetic compile --sign-key`).

Owns: the command line. The key file format lives in kinetic.ktc.keys: FILE holds the secret key as
64 hex digits (readable only by its owner), FILE.pub the public key others verify with.
"""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser(
        "keygen",
        help="make an Ed25519 signing key (FILE) and its public key (FILE.pub)",
        description="Write a new Ed25519 secret key to FILE as 64 hex digits (mode 0600) and its public key to "
        "FILE.pub, never over an existing file unless --force is given. Sign with `kinetic compile --sign-key "
        "FILE`; check with `kinetic verify MODEL.ktc --key FILE.pub`.",
    )
    p.add_argument("file", help="where to write the secret key")
    p.add_argument("--force", action="store_true",
                   help="replace FILE and FILE.pub when they exist (the old key is lost for good)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kinetic.ktc.keys import generate_key_file

    public = generate_key_file(args.file, force=args.force)
    print(f"secret key written to {args.file}; keep it private")
    print(f"public key {public} (also in {args.file}.pub)")
    return 0
