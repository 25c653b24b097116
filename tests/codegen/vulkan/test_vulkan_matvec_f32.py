"""F32 weights on Vulkan (matvec_f32.py): the matvec gives numerics.matmul's result (float_dot's F32
order: 64 fma lanes, ggml's reduction tree, the leftover values as rounded products up to the last
whole 8 and then fmas) for passes of 1, 2, 3, 8 and 17 rows and every shape of tail, bit for bit on
lavapipe, and its SPIR-V validates."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from vulkan_helpers import assert_reference, random_weight, spirv_val

from kinetic.codegen.vulkan import matvec_f32
from kinetic.ir import numerics

ROWS = (1, 2, 3, 8, 17)
# K: whole chunks only; a tail of 32 (only rounded products); 36 (32 of them, then 4 fmas); 6 (only
# fmas); a K below one chunk (the tail alone); 200 (three chunks and a tail of 8)
WIDTHS = (128, 96, 100, 70, 40, 200)


@pytest.mark.parametrize("k", WIDTHS)
def test_f32_matvec_equals_reference_for_every_row_count(ops, device, k):
    """1, 2, 3, 8 and 17 rows against 13 outputs: numerics.matmul's values (bit for bit on lavapipe)."""
    rng = np.random.default_rng(k)
    raw = random_weight(rng, Q.F32, 13, k)
    wbuf = ops.upload_weight(raw, Q.F32)
    exact = device.caps.is_cpu and device.target.fma_mode != "unfused"
    try:
        for rows in ROWS:
            x = (rng.standard_normal((rows, k)) * 3).astype(np.float32)
            x[0, :3] = [0.0, -0.0, 1e-39]
            ref = numerics.matmul(x, numerics.DequantizedWeight(raw, Q.F32))
            got = ops.matmul(x, raw, Q.F32, weight_buffer=wbuf)
            assert_reference(got, ref, exact, rtol=0, atol=float(np.abs(ref).max()) * 1e-5)
    finally:
        ops.device.free(wbuf)


@pytest.mark.parametrize("k", [64, 100])
def test_f32_matvec_validates(device, k):
    """The rendered module passes spirv-val (Vulkan 1.2 rules)."""
    spirv_val(matvec_f32.render_matvec_f32(device.target, 13, k).spirv)
