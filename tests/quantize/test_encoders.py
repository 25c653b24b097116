"""Kinetic's encoders against ggml's own (hashes recorded from libggml-base's ggml_quantize_chunk by
record_blocks.py), on rows that reach every branch of the reference quantizers (block_cases.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from kinetic.quantize import kquant_search
from kinetic.quantize.encoders import ENCODERS
from tests.quantize.block_cases import block_cases

RECORD = json.loads((Path(__file__).parents[1] / "data" / "quantize" / "ggml_blocks.json").read_text())
CASES = block_cases()


@pytest.mark.parametrize("type_name", sorted(next(iter(RECORD.values()))))
@pytest.mark.parametrize("case", sorted(RECORD))
def test_encoder_matches_ggml_bit_for_bit(case: str, type_name: str):
    """Encoding a case's rows gives exactly the bytes ggml's reference quantizer gives."""
    encoded = ENCODERS[GGMLQuantizationType[type_name]](CASES[case])
    assert hashlib.sha256(encoded.tobytes()).hexdigest() == RECORD[case][type_name]


def test_nearest_int_rounds_half_to_even_like_ggml():
    """nearest_int is ggml's magic-number rounding: ties to even, negatives symmetric."""
    values = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4999998, 3.5000002, -7.5, 4194303.0], np.float32)
    assert nearest_int_list(values) == [0, 2, 2, 0, -2, 2, 4, -8, 4194303]


def nearest_int_list(values: np.ndarray) -> list[int]:
    return [int(v) for v in kquant_search.nearest_int(values)]
