"""Q4_K's one row alone (decode) runs matmul_k_columns_ir's column groups (four columns at a time, in
both numerics modes: its ggml order is block_chain's), more rows left run matmul_rows_ir's rows (a
branch at run time). Every output must be the reference's, in both orders' names, over column
ranges that end inside a group."""

from __future__ import annotations

import numpy as np
import pytest
from cpu_kernel_helpers import HOST_VARIANTS, assert_bits, random_weight
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu import matmul_k_columns_ir
from kinetic.codegen.cpu.matmul import quantized_matmul
from kinetic.codegen.cpu.quant_blocks import LAYOUTS
from kinetic.ir import numerics


@pytest.mark.parametrize("variant", HOST_VARIANTS)
def test_decode_over_any_column_range_equals_the_reference(jit, variant):
    """One row (the groups) and three (the rows), N = 1 .. 23 (groups of four whole and cut short),
    K = 256 and 1024, over 1, 2 and 3 threads: each output has the bits numerics.matmul gives in the
    ggml order and in block_chain (the same order for Q4_K)."""
    assert matmul_k_columns_ir.applies(LAYOUTS[Q.Q4_K])
    rng = np.random.default_rng(11)
    for k, n in ((256, 1), (256, 3), (256, 6), (1024, 9), (1024, 23)):
        w = random_weight(rng, Q.Q4_K, n, k)
        for m in (1, 3):
            x = rng.standard_normal((m, k)).astype(np.float32)
            weight = numerics.DequantizedWeight(w, Q.Q4_K)
            for order in (None, "block_chain"):
                want = numerics.matmul(x, weight, order=order)
                for threads in (1, 2, 3):
                    got = quantized_matmul(x, w, Q.Q4_K, jit=jit, variant=variant, threads=threads, order=order)
                    assert_bits(got, want, f"{variant} K={k} N={n} M={m} order={order} threads={threads}")
