"""Ed25519 key files: reading a secret key to sign with, making one, and reading a public key.

Owns: the key file format. A secret key file holds the 32-byte Ed25519 seed, either as 32 raw bytes
or as 64 hex digits (surrounding whitespace ignored); `kinetic keygen FILE` writes the hex form,
readable only by its owner, and FILE.pub with the public key as 64 hex digits. A public key is
given as 64 hex digits or as a file holding them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from kinetic.errors import KineticError

_HEX64 = re.compile(rb"\s*([0-9a-fA-F]{64})\s*")
_FORMAT = "an Ed25519 key file holds 32 bytes or 64 hex digits"


def read_signing_key(path: str | os.PathLike):
    """The nacl.signing.SigningKey in a secret key file."""
    from nacl.signing import SigningKey

    path = Path(path)
    if path.suffix == ".pub":
        raise KineticError(f"{path} is a public key file; signing needs the secret key",
                           "Give the key file without .pub (the one `kinetic keygen FILE` wrote as FILE).")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise KineticError(f"cannot read key file {path}: {exc.strerror or exc}",
                           "Check the --sign-key path.") from None
    match = _HEX64.fullmatch(raw)
    if match:
        return SigningKey(bytes.fromhex(match.group(1).decode()))
    if len(raw) == 32:
        return SigningKey(raw)
    raise KineticError(f"key file {path} holds {len(raw)} bytes that are not a key; {_FORMAT}",
                       "Make a key with `kinetic keygen FILE`.")


def read_public_key(spec: str) -> bytes:
    """A public key from 64 hex digits or from a file holding them (such as keygen's FILE.pub)."""
    text = spec.encode()
    if not _HEX64.fullmatch(text):
        try:
            text = Path(spec).read_bytes()
        except OSError as exc:
            raise KineticError(f"{spec} is neither 64 hex digits nor a readable file ({exc.strerror or exc})",
                               "Give the public key as 64 hex digits or the FILE.pub keygen wrote.") from None
    match = _HEX64.fullmatch(text)
    if not match:
        raise KineticError(f"{spec} does not hold a public key as 64 hex digits",
                           "Give the public key as 64 hex digits or the FILE.pub keygen wrote.")
    return bytes.fromhex(match.group(1).decode())


def generate_key_file(path: str | os.PathLike, *, force: bool = False) -> str:
    """Write a new secret key to path (mode 0600) and its public key to path + '.pub', each
    atomically and over an existing file only with force (kinetic.outputs); returns the public key
    in hex. Both paths are checked before either is written."""
    from nacl.signing import SigningKey

    from kinetic.outputs import check_output, write_output

    path = Path(path)
    pub = path.with_name(path.name + ".pub")
    for target in (path, pub):
        check_output(target, force=force)
    key = SigningKey.generate()
    public = bytes(key.verify_key).hex()
    write_output(path, bytes(key).hex() + "\n", force=force, private=True)
    write_output(pub, public + "\n", force=force)
    return public
