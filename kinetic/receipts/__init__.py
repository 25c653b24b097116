"""Receipts: a record of one answer (model hash, build, device class, prompt tokens, every sampling
setting with the seed, output tokens), optionally signed, that `kinetic verify-receipt` reruns.

Owns: the record and its canonical signed form (receipt.py), the strict JSON a receipt file must be
(strict_json.py), the hashes it holds (hashing.py) and the checks and the plain rerun (verify.py).
Does not own sampling, the model or the command lines.
User-facing description: docs/receipts.md.
"""

from kinetic.receipts.hashing import build_hash, file_blake3, token_hash
from kinetic.receipts.receipt import (
    RECEIPT_VERSION,
    Answer,
    canonical_bytes,
    make_receipt,
    read_receipt,
    signature_valid,
    write_receipt,
)

__all__ = [
    "RECEIPT_VERSION", "Answer", "build_hash", "canonical_bytes", "file_blake3", "make_receipt", "read_receipt",
    "signature_valid", "token_hash", "write_receipt",
]
