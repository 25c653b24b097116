"""Records ggml's own encodings of block_cases.py, for test_encoders.py: run by hand where llama.cpp is
built (`python -m tests.quantize.record_blocks [LIBGGML_BASE]`), never by the test suite.

Calls ggml_quantize_chunk (no importance matrix: the reference quantizers llama-quantize runs) from
libggml-base through ctypes, and stores the SHA-256 of each case's bytes per type in
tests/data/quantize/ggml_blocks.json.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from tests.quantize.block_cases import block_cases

RECORD = Path(__file__).parents[1] / "data" / "quantize" / "ggml_blocks.json"
TYPES = ("F16", "BF16", "Q8_0", "Q6_K", "Q5_K", "Q5_1", "Q5_0", "Q4_K", "Q4_1", "Q4_0", "Q3_K")
DEFAULT_LIB = Path.home() / ".cache/kinetic-ref/llama.cpp/build/bin/libggml-base.so"


def ggml_encode(lib, values: np.ndarray, qtype: GGMLQuantizationType) -> bytes:
    rows, ncols = values.shape
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    out = np.zeros(rows * ncols // block * block_bytes, np.uint8)
    size = lib.ggml_quantize_chunk(int(qtype), values.ctypes.data, out.ctypes.data, 0, rows, ncols, None)
    assert size == out.size
    return out.tobytes()


def main(lib_path: Path) -> None:
    lib = ctypes.CDLL(str(lib_path))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    record = {name: {t: hashlib.sha256(ggml_encode(lib, values, GGMLQuantizationType[t])).hexdigest() for t in TYPES}
              for name, values in block_cases().items()}
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_LIB)
