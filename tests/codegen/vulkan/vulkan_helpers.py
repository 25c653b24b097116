"""Helpers for the Vulkan tests: spirv-val and comparisons against the reference."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest


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
F16_FIELDS = {
    "Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,),
}


def random_weight(rng: np.random.Generator, wtype, n: int, k: int) -> np.ndarray:
    """u8 [n, row_bytes]: random quant bytes (every bit pattern of the quants and packed scales),
    f16 scales drawn from N(0, 0.02) (signed, like real minimums)."""
    from kinetic.ir.quants import quant_type

    layout = quant_type(wtype)
    blocks = rng.integers(0, 256, (n, k // layout.block, layout.block_bytes), dtype=np.uint8)
    for off in F16_FIELDS[wtype.name]:
        scales = (rng.standard_normal(blocks.shape[:2]) * 0.02).astype(np.float16)
        blocks[:, :, off : off + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(n, -1)
