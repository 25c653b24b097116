"""What `kinetic info` says about a .ktc file: the model's facts as for a .gguf, and the file's own.

Owns: the extra rows (format, profile, signature, source) and the `ktc` object of `--json`. Reads
the structure and the small sections (each hash checked), never the weights' bytes, so it stays
instant; `kinetic verify` checks the rest.
"""

from __future__ import annotations

import os
from dataclasses import replace

from kinetic.ktc.load import LoadedKtc


def read_ktc_info(path: str | os.PathLike):
    """(ModelInfo with the .ktc file's size, the `ktc` facts as a JSON-ready dict)."""
    from kinetic.frontend.model_info import describe

    ktc = LoadedKtc(path, hash_weights=False)
    info = replace(describe(ktc.gguf), size_bytes=ktc.file.file_size)
    sig = ktc.file.signature
    facts = {
        "format_version": ktc.file.header.version,
        "profile": ktc.profile.to_json(),
        "signed": sig is not None,
        "public_key": sig.public_key_hex if sig else None,
        "source": ktc.metadata.get("source"),
        "sections": [{"kind": kind.label, "offset": e.offset, "bytes": e.size, "blake3": e.digest.hex()}
                     for kind, e in ktc.file.entries.items()],
    }
    return info, facts


def format_ktc_rows(facts: dict) -> str:
    from kinetic.frontend.model_info import LABEL_WIDTH

    p = facts["profile"]
    tuned = "tuned" if p["tuned"] else "defaults, not tuned"
    source = facts["source"] or {}
    rows = [
        ("compiled", f".ktc format {facts['format_version']} by kinetic {p['kinetic_version']}, "
                     f"{len(facts['sections'])} sections"),
        ("profile", f"{p['device_class']} ({tuned})"),
        ("signature", f"public key {facts['public_key']}" if facts["signed"] else "none (unsigned)"),
        ("source", f"{source.get('file')}, blake3 {str(source.get('blake3'))[:16]}..."),
    ]
    return "\n".join(f"  {label:<{LABEL_WIDTH}}{value}" for label, value in rows)
