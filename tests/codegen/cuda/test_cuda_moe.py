"""The mixture-of-experts kernels (kinetic/codegen/cuda/moe.py) on the host emulation, in both thread
orders, against the reference numerics (kinetic/ir/numerics/moe.py, numerics.matmul per expert) bit
for bit; and the renderer's rows for the MoE ops."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_helpers import host_programs, quantize_rows, random_weight, reference_matmul
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cuda import gemv, moe
from kinetic.codegen.cuda.renderer import KERNELS
from kinetic.ir.numerics import moe as moe_numerics
from kinetic.ir.ops import Op
from tests.device_checks import same_bits

# experts: 4 (all tail), 20 (a block of 16 and a tail of 4), 64 (four blocks, no tail)
GATES = [(4, "softmax"), (20, "softmax"), (64, "softmax"), (8, "sigmoid")]
SELECTS = [(4, 2, False), (20, 4, False), (8, 3, True), (64, 8, True)]  # experts, top-k, biased
WEIGHTS = [(4, 2, True, 0.0), (20, 4, True, 2.5), (8, 3, False, 1.0), (8, 1, False, 0.75)]
SUMS = [(2, 300), (4, 64), (1, 32)]  # slots, width
# stacked weights: a legacy type (Q8_1 rows), Q8_0, a super-block type (Q8_K rows), F16 (f32 rows)
EXPERT_MATMULS = [(Q.Q4_1, 6, 40, 64), (Q.Q8_0, 4, 32, 96), (Q.Q4_K, 5, 16, 256), (Q.F16, 4, 24, 64)]
ROWS = 7


def _kernels() -> list:
    kernels = [moe.gate(*g) for g in GATES] + [moe.select(*s) for s in SELECTS]
    kernels += [moe.route_weights(*w) for w in WEIGHTS] + [moe.weighted_sum(*s) for s in SUMS]
    for wtype, n_expert, n_out, k in EXPERT_MATMULS:
        fmt = gemv.activation_format(wtype)
        kernels += [moe.expert_gemv(wtype, n_expert, n_out, k), moe.slot_rows(3, k)]
        kernels += [moe.quantize.quantize(fmt, k)] if fmt in moe.ROW_FORMATS else []
    return kernels


prog = host_programs(_kernels, "cuda-moe")  # the kernels on the host, in both orders


def _logits(rng, n_expert: int) -> np.ndarray:
    """Router logits of every scale, with ties (equal values in a row) and an exp underflow."""
    x = (rng.standard_normal((ROWS, n_expert)) * np.float32(10) ** rng.integers(-2, 2, (ROWS, 1))).astype(np.float32)
    x[0, 1] = x[0, 0]  # a tie
    x[1, -1] = -200.0  # exp underflows to 0
    return x


@pytest.mark.parametrize("n_expert,gating", GATES)
def test_gate_equals_the_reference(prog, n_expert, gating):
    """moe_gate's kernel gives numerics.moe.gate's bits: the softmax's blocks of 16 and libm tail
    summed as the reference's double, or the sigmoid."""
    x = _logits(np.random.default_rng(n_expert), n_expert)
    out = np.zeros_like(x)
    prog.launch(moe.gate(n_expert, gating).name, ROWS, x, out)
    with np.errstate(over="ignore"):
        assert same_bits(out, moe_numerics.gate(x, gating))


@pytest.mark.parametrize("n_expert,n_used,biased", SELECTS)
def test_select_equals_the_reference(prog, n_expert, n_used, biased):
    """moe_select's kernel picks numerics.moe.top_k's experts in its order (ties to the lower expert),
    on the probabilities plus the bias when there is one."""
    rng = np.random.default_rng(100 + n_expert)
    probs = moe_numerics.softmax_rows(_logits(rng, n_expert))
    probs[2, :] = probs[2, 0]  # a row of equal scores: the lowest experts, in order
    probs[3, 3] = probs[3, 1]
    bias = (rng.standard_normal(n_expert) * 0.01).astype(np.float32)
    ids = np.zeros((ROWS, n_used), np.float32)
    prog.launch(moe.select(n_expert, n_used, biased).name, ROWS, probs, *((bias,) if biased else ()), ids)
    scores = (probs + bias).astype(np.float32) if biased else probs
    assert np.array_equal(ids.astype(np.int32), moe_numerics.top_k(scores, n_used))


@pytest.mark.parametrize("n_expert,n_used,normalize,scale", WEIGHTS)
def test_route_weights_equal_the_reference(prog, n_expert, n_used, normalize, scale):
    """moe_weights' kernel gives numerics.moe.route_weights' bits (the sum in a double, the clamp, the
    scale), a row whose chosen probabilities sum below the clamp included."""
    rng = np.random.default_rng(200 + n_expert)
    probs = moe_numerics.softmax_rows(_logits(rng, n_expert))
    probs[4, :] = 1e-7  # a sum under F16's smallest normal: clamped
    ids = moe_numerics.top_k(probs, n_used)
    out = np.zeros((ROWS, n_used), np.float32)
    prog.launch(moe.route_weights(n_expert, n_used, normalize, scale).name, ROWS, probs, ids.astype(np.float32), out)
    assert same_bits(out, moe_numerics.route_weights(probs, ids, normalize=normalize, scale=scale))


@pytest.mark.parametrize("n_used,width", SUMS)
def test_weighted_sum_equals_the_reference(prog, n_used, width):
    """moe_sum's kernel gives numerics.moe.weighted_sum's bits (products rounded, slots added in order)."""
    rng = np.random.default_rng(300 + width)
    y = rng.standard_normal((ROWS, n_used * width)).astype(np.float32) * np.float32(1e3)
    w = rng.random((ROWS, n_used)).astype(np.float32)
    out = np.zeros((ROWS, width), np.float32)
    prog.launch(moe.weighted_sum(n_used, width).name, ROWS, y, w, out)
    assert same_bits(out, moe_numerics.weighted_sum(y, w))


@pytest.mark.parametrize("wtype,n_expert,n_out,k", EXPERT_MATMULS, ids=lambda v: getattr(v, "name", str(v)))
def test_expert_matmul_equals_each_expert_alone(prog, wtype, n_expert, n_out, k):
    """Slot rows copied from shared inputs, quantized, through the expert GEMV: each slot equals the
    reference's product of its row with the expert it chose alone, for every expert of the stack."""
    rng = np.random.default_rng(400 + k)
    stack = np.stack([random_weight(rng, wtype, n_out, k) for _ in range(n_expert)])  # u8 [E, n_out, bytes]
    n_used = 3
    x = (rng.standard_normal((ROWS, k)) * 2).astype(np.float32)
    ids = np.stack([rng.permutation(n_expert)[:n_used] for _ in range(ROWS)]).astype(np.int32)
    copies = np.zeros((ROWS * n_used, k), np.float32)
    prog.launch(moe.slot_rows(n_used, k).name, ROWS * n_used, x, copies)
    assert same_bits(copies, np.repeat(x, n_used, axis=0))
    acts = quantize_rows(prog, np, copies, gemv.activation_format(wtype))
    y = np.zeros((ROWS * n_used, n_out), np.float32)
    prog.launch(moe.expert_gemv(wtype, n_expert, n_out, k).name, ROWS * n_used, np.ascontiguousarray(stack),
                ids.reshape(-1).astype(np.float32), *acts, y)
    for slot, expert in enumerate(ids.reshape(-1)):
        want = reference_matmul(x[slot // n_used : slot // n_used + 1], stack[expert], wtype)
        assert same_bits(y[slot : slot + 1], want), f"slot {slot} (expert {expert})"


def test_the_renderer_has_a_row_for_every_moe_op():
    """Every MoE op has a CUDA row, so a MoE graph is not refused for a missing kernel."""
    assert moe.OPS <= set(KERNELS)
    assert {Op.MOE_GATE, Op.MOE_SELECT, Op.MOE_WEIGHTS, Op.MOE_MATMUL, Op.MOE_SUM} == moe.OPS
