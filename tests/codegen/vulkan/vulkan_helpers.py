"""Helpers for the Vulkan tests: spirv-val and comparisons against the reference."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from tests import random_tensors


def spirv_val(spirv: bytes) -> None:
    """Assert that spirv-val (Vulkan 1.2 rules) accepts the module; skip where it is not installed."""
    tool = shutil.which("spirv-val")
    if tool is None:
        pytest.skip("spirv-val not installed (apt install spirv-tools)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.spv"
        path.write_bytes(spirv)
        result = subprocess.run([tool, "--target-env", "vulkan1.2", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def assert_reference(got: np.ndarray, ref: np.ndarray, exact: bool, rtol: float = 0.0, atol: float = 0.0) -> None:
    """Bit for bit when `exact`, else within the stated tolerance."""
    ref = np.asarray(ref, np.float32)
    assert got.shape == ref.shape
    if exact:
        differ = np.flatnonzero(bits(got) != bits(ref))
        assert differ.size == 0, f"{differ.size} of {got.size} differ, first at {differ[:5]}: " \
                                 f"{got.reshape(-1)[differ[:5]]} vs {ref.reshape(-1)[differ[:5]]}"
    else:
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)


# byte offsets of each layout's f16 scale fields; every other byte pattern is a valid encoding
F16_FIELDS = {q.name: offsets for q, offsets in random_tensors.F16_FIELDS.items()}


def random_weight(rng: np.random.Generator, wtype, n: int, k: int) -> np.ndarray:
    """u8 [n, row_bytes]: random quant bytes (every bit pattern of the quants and packed scales),
    f16 scales drawn from N(0, 0.02) (signed, like real minimums); F16: the bytes of random values."""
    from kinetic.ir.quants import quant_type

    layout = quant_type(wtype)
    if layout.activation == "f16":  # float weights: N(0, 1) values, signed zeros, a subnormal, the largest
        values = rng.standard_normal((n, k)).astype(np.float16)
        values.reshape(-1)[:4] = [0.0, -0.0, 6e-8, 65504.0]
        return values.view(np.uint8)
    if layout.activation == "f32":  # N(0, 1) values, signed zeros, a subnormal
        values = rng.standard_normal((n, k)).astype(np.float32)
        values.reshape(-1)[:3] = [0.0, -0.0, 1e-40]
        return values
    if layout.activation == "bf16":  # the top halves of f32 values (any 16 bits are a bf16)
        bits = (rng.standard_normal((n, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        bits.reshape(-1)[:5] = [0x0000, 0x8000, 0x0001, 0x807F, 0x7F7F]  # zeros, subnormals, the largest
        return bits.view(np.uint8)
    blocks = rng.integers(0, 256, (n, k // layout.block, layout.block_bytes), dtype=np.uint8)
    for off in F16_FIELDS[wtype.name]:
        scales = (rng.standard_normal(blocks.shape[:2]) * 0.02).astype(np.float16)
        blocks[:, :, off : off + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(n, -1)
