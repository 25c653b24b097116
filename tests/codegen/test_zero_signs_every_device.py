"""Signed zeros on every device: each op of the batch-invariance matrix, fed all-zero rows (+0 and -0
activations from the token table, all-zero weight rows, -0 rows of the other tables, BF16 products
that flush to signed zeros), gives the reference interpreter's bits, zero signs included, on the
CPU, the CUDA emulation and Vulkan.

The reference's zeros are ggml's: its accumulators start at +0 (`_mm256_setzero_ps`, `float sumf =
0`), so a dot of zero products is +0 (-0 + +0 = +0 in round to nearest). Vulkan on Mesa 22.3 folds
`a + 0.0` into a whatever the float controls say, which gave -0 for such rows until the kernels'
adds and fmas chose the sign of a zero sum from their operands (builders.add / builders.fma)."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic import devices
from kinetic.ir.rows import PassRows
from kinetic.ir.text import parse_graph
from kinetic.passes import PassOptions, run_pipeline
from kinetic.runtime.engine import Engine
from tests.codegen.test_batch_invariance_matrix import CASES, DEVICES, RandomWeights

TOKENS = [0, 1, 0, 1, 5, 0, 3]  # 0: a +0 row of every table, 1: a -0 row of the Q8_0 tables, 3: 0.5s
Q8_0_BLOCK = 34
NEGATIVE_ONE_F16 = np.frombuffer(np.float16(-1.0).tobytes(), np.uint8)
HALF_F16 = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
TINY_NEGATIVE_BF16 = np.uint16(np.float32(-2e-38).view(np.uint32) >> 16)  # times 0.5: a subnormal, flushed to -0


def _zero_rows(weights: RandomWeights) -> RandomWeights:
    """Row 0 of every table +0 (all bytes zero); row 1 of the Q8_0 tables -0 (d = -1, every quant 0),
    of the float tables -0; row 3 of the token table 0.5 everywhere (d = 0.5, every quant 1) and
    row 3 of BF16 weights a tiny negative value in the lanes' 64 (every product flushes to -0, and so
    every lane) and -0 after them."""
    for name, table in weights.arrays.items():
        if table.ndim != 2:
            continue
        table[0] = 0
        if table.dtype == np.uint8 and table.shape[1] % Q8_0_BLOCK == 0 and name != "w":
            blocks = table[1].reshape(-1, Q8_0_BLOCK)
            blocks[:] = 0
            blocks[:, 0:2] = NEGATIVE_ONE_F16
            if name == "token_embd.weight":
                halves = table[3].reshape(-1, Q8_0_BLOCK)
                halves[:, 0:2], halves[:, 2:] = HALF_F16, 1
        elif table.dtype in (np.float32, np.float16):
            table[1] = -0.0
        elif table.dtype == np.uint16:  # BF16
            table[1], table[3, :64], table[3, 64:] = 0x8000, TINY_NEGATIVE_BF16, 0x8000  # past the lanes: -0
    return weights


def _rows(case_name: str, device: str) -> np.ndarray:
    """The f32 [len(TOKENS), out] rows of one pass over the zeroed weights (skips where the device
    cannot run the case, as the matrix does)."""
    d = devices.DEVICES[device]
    if d.unavailable():
        pytest.skip(f"{device}: {d.unavailable()}")
    case = CASES[case_name]
    graph = run_pipeline(parse_graph(case.text()), PassOptions(numerics=case.numerics))  # the case's mode
    if d.unsupported(graph):
        pytest.skip(f"{device} has no kernel for this case: {d.unsupported(graph)}")
    engine = Engine(graph, _zero_rows(RandomWeights(case)), n_ctx=32, batch=8, device=device, threads=1)
    try:
        return engine.forward(PassRows.chain(TOKENS, 0, outputs="all"), {0: engine.new_sequence()})
    finally:
        engine.close()


@pytest.mark.parametrize("device", DEVICES[1:])
@pytest.mark.parametrize("case_name", sorted(CASES))
def test_zero_rows_give_the_references_signed_zeros(case_name, device):
    """Rows of +0 and -0 activations and weights give the reference's bits (zero signs included)."""
    got, want = _rows(case_name, device), _rows(case_name, "reference")
    differ = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
    assert differ.size == 0, f"{len(differ)} differ, first {differ[:3].tolist()}: " \
                             f"{[(got[i, j], want[i, j]) for i, j in differ[:3]]}"
