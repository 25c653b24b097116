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


def generate_key_file(path: str | os.PathLike) -> str:
    """Write a new secret key to path (mode 0600, never over an existing file) and its public key to
    path + '.pub'; returns the public key in hex."""
    from nacl.signing import SigningKey

    path = Path(path)
    pub = path.with_name(path.name + ".pub")
    key = SigningKey.generate()
    public = bytes(key.verify_key).hex()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise KineticError(f"{path} exists already",
                           "Choose another file name; keygen never overwrites a key.") from None
    except OSError as exc:
        raise KineticError(f"cannot create {path}: {exc.strerror or exc}", "Check the path.") from None
    with os.fdopen(fd, "w") as f:
        f.write(bytes(key).hex() + "\n")
    try:
        pub.write_text(public + "\n")
    except OSError as exc:
        raise KineticError(f"cannot write {pub}: {exc.strerror or exc}", "Check the path.") from None
    return public
