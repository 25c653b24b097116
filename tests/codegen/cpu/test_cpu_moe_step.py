"""The tape's native moe_matmul (kinetic/codegen/cpu/moe_step.py): every (row, slot) of a pass, run
as the step's shares run it, equals that slot's row alone through the generated matmul on its
expert, bit for bit, for any number of rows and shares (threads)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu import float_matmul_ir, moe_step
from kinetic.codegen.cpu.matmul import float_matmul, quantized_matmul
from kinetic.codegen.cpu.quant_blocks import LAYOUTS
from kinetic.codegen.cpu.step_kernels import StepKernels
from kinetic.ir.ops import QUANTIZED_ROWS
from tests.codegen.cpu.cpu_kernel_helpers import random_weight

F32 = np.float32
N_EXPERT, N_OUT, K, N_USED = 6, 40, 256, 3


def _stack(rng, wtype: Q) -> np.ndarray:
    """A stacked expert weight as the file stores it: [n_expert, N, row bytes or values]."""
    if wtype is Q.F16:
        return (rng.standard_normal((N_EXPERT, N_OUT, K)) * 0.1).astype(np.float16)
    return np.stack([random_weight(rng, wtype, N_OUT, K) for _ in range(N_EXPERT)])


def _alone(x_row: np.ndarray, expert_weight: np.ndarray, wtype: Q) -> np.ndarray:
    if wtype is Q.F16:
        return float_matmul(x_row[None], expert_weight, wtype)[0]
    return quantized_matmul(x_row[None], expert_weight, wtype)[0]


class _Pass:
    """One pass's arenas laid out as the tape's buffers: x, ids, output, scratch; grouped rows."""

    def __init__(self, kernels: StepKernels, raw: np.ndarray, wtype: Q, x: np.ndarray, ids: np.ndarray):
        rows, places = x.shape[0], ids.size
        if wtype is Q.F16:
            fmt, block, rounded = "f16", 1, True
            e_row = K * float_matmul_ir.ACTIVATION_BYTES[wtype]
            quantizer, kernel, q_bytes, d_bytes = kernels.round(fmt), kernels.float_matmul(wtype, K), 0, 0
        else:
            fmt, rounded = LAYOUTS[wtype].activation, False
            block = QUANTIZED_ROWS[fmt]
            e_row = {"q8_1": K // 32 * 4, "q8_k": K // 16 * 4}.get(fmt, 0)
            quantizer, kernel = kernels.quantize(fmt), kernels.matmul(wtype, K)
            q_bytes, d_bytes = places * K, places * (K // block) * 4
        common = dict(k=K, x_width=x.shape[1], block=block, e_row=e_row, n_used=N_USED, n_expert=N_EXPERT,
                      rounded=rounded)
        self.quant = moe_step.parameters(kernel=quantizer, **common)
        self.raw = raw
        self.mm = moe_step.parameters(kernel=kernel, weight=raw.ctypes.data, expert_bytes=raw.nbytes // N_EXPERT,
                                      n=N_OUT, **common)
        self.x, self.ids, self.y = 16, 16 + x.size, 16 + x.size + places
        self.scratch = self.y + places * N_OUT
        self.arena = np.full(self.scratch + places * N_OUT + 16, np.nan, F32)
        self.arena[self.x: self.x + x.size] = x.reshape(-1)
        self.arena[self.ids: self.ids + places] = ids.reshape(-1)
        self.bytes = np.zeros(q_bytes + d_bytes + places * e_row + 64, np.uint8)
        base = self.bytes.ctypes.data
        self.q, self.d, self.e = base, base + q_bytes, base + q_bytes + d_bytes
        self.rows = rows

    def run(self, shares: int) -> np.ndarray:
        """Every share of the quantization, then (a barrier) every share of the products."""
        a, addr = self.arena, self.arena.ctypes.data
        for share in range(shares):
            moe_step.quantize_slots(self.quant.ctypes.data, a, addr, self.x, self.ids, self.q, self.d, self.e,
                                    self.rows, share, shares)
        for share in range(shares):
            moe_step.matmul_slots(self.mm.ctypes.data, a, addr, self.ids, self.q, self.d, self.e, self.y,
                                  self.scratch, self.rows, share, shares)
        return a[self.y: self.y + self.rows * N_USED * N_OUT].reshape(self.rows, N_USED, N_OUT).copy()


@pytest.mark.parametrize("wtype", [Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.F16], ids=lambda w: w.name)
@pytest.mark.parametrize("shared_input", [True, False])
def test_native_moe_matmul_rows_equal_each_slot_alone(wtype, shared_input):
    """Each (row, slot) of passes of 1..9 rows on 1..3 shares equals its input row alone times its
    expert through the generated kernel, bit for bit: grouping rows by expert (several rows on
    one expert, one row on an expert, unused experts) changes no row's arithmetic."""
    rng = np.random.default_rng(hash((wtype.name, shared_input)) % 2**32)
    raw = _stack(rng, wtype)
    kernels = StepKernels()
    width = K if shared_input else N_USED * K
    x_all = (rng.standard_normal((9, width)) * 2).astype(F32)
    ids_all = np.stack([rng.permutation(N_EXPERT)[:N_USED] for _ in range(9)]).astype(F32)
    ids_all[3] = ids_all[1]  # rows sharing every expert
    alone = np.empty((9, N_USED, N_OUT), F32)
    for r in range(9):
        for s in range(N_USED):
            row = x_all[r] if shared_input else x_all[r, s * K:(s + 1) * K]
            alone[r, s] = _alone(row, raw[int(ids_all[r, s])], wtype)
    for rows in (1, 2, 5, 9):
        for shares in (1, 2, 3):
            got = _Pass(kernels, raw, wtype, x_all[:rows], ids_all[:rows]).run(shares)
            np.testing.assert_array_equal(got.view(np.uint32), alone[:rows].view(np.uint32),
                                          err_msg=f"{rows} rows, {shares} shares")
