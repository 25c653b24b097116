"""Every weight type's matmul on every device is the reference interpreter's, bit for bit, for passes
of 1, 2, 3, 8 and 17 rows: the matmul cases of the batch-invariance matrix (one per weight type a
device runs: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, the K-quants, F16, BF16, F32) run on the reference and on
each device. (The matrix checks each device against itself, row alone against row in a pass; this
checks it against the reference.) A device that refuses a case skips it with its reason; the
completeness test keeps every weight type the reference runs in the list."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.ir.rows import PassRows
from tests.codegen.test_batch_invariance_matrix import CASES, DEVICES, ROW_COUNTS, VOCAB, _engine
from tests.device_checks import same_bits

MATMUL_CASES = sorted(name for name in CASES if name.startswith("matmul_") and name != "matmul_float_path")


def _all_rows(case_name: str, device: str, n: int) -> np.ndarray:
    """The f32 [n, out] rows of one pass of n consecutive tokens on a fresh sequence."""
    tokens = np.random.default_rng(11).integers(0, VOCAB, n).tolist()
    engine = _engine(case_name, device)
    try:
        return engine.forward(PassRows.chain(tokens, 0, outputs="all"), {0: engine.new_sequence()})
    finally:
        engine.close()


@pytest.mark.parametrize("device", DEVICES[1:])
@pytest.mark.parametrize("case_name", MATMUL_CASES)
def test_a_matmul_on_a_device_is_the_reference(case_name, device):
    """A pass of 1, 2, 3, 8 or 17 rows through one weight type's matmul gives the reference
    interpreter's bits on the device."""
    for n in ROW_COUNTS:
        assert same_bits(_all_rows(case_name, device, n), _all_rows(case_name, "reference", n)), f"{n} rows"


def test_every_gpu_weight_type_has_a_case():
    """Each weight type with a matmul kernel on CUDA or Vulkan has a case here."""
    from kinetic.codegen.cuda.gemv import ALL as CUDA_WEIGHTS
    from kinetic.codegen.vulkan.ops import SUPPORTED_WEIGHTS

    cased = {name.removeprefix("matmul_") for name in MATMUL_CASES}
    kernels = {t.name.lower() for t in (*CUDA_WEIGHTS, *SUPPORTED_WEIGHTS)}
    assert kernels <= cased
