"""The mixture-of-experts kernels on Vulkan (kinetic/codegen/vulkan/moe.py, the matvecs' `experts`
binding, moe_records.py) against the reference numerics (kinetic/ir/numerics/moe.py, numerics.matmul
per expert): bit for bit on lavapipe; and the runner's refusal of experts that do not fit."""

from __future__ import annotations

import struct
from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from vulkan_helpers import assert_reference, bits, random_weight, spirv_val

from kinetic.codegen.vulkan import matvec, matvec_f32, matvec_float, matvec_k, moe
from kinetic.codegen.vulkan.attention import expf_table_words
from kinetic.codegen.vulkan.builders import Target
from kinetic.codegen.vulkan.device import Unsupported
from kinetic.codegen.vulkan.moe_records import check_experts_fit
from kinetic.ir import numerics
from kinetic.ir.numerics import moe as moe_numerics

F32 = np.float32
ROWS = 7
GATE_ROWS = 280  # enough rows that a block summed in another order changes some row's 1 / sum
# experts: 4 (all tail), 20 (a block of 16 and a tail of 4), 64 (four blocks, no tail)
SOFTMAX_EXPERTS = (4, 20, 64)
SELECTS = [(4, 2, False), (20, 4, False), (8, 3, True), (64, 8, True)]  # experts, top-k, biased
WEIGHTS = [(4, 2, True, 0.0), (20, 4, True, 2.5), (8, 3, False, 1.0), (8, 1, False, 0.75)]
SUMS = [(2, 300), (4, 64), (1, 32)]  # slots, width
# stacked weights: legacy types (Q8_1 and Q8_0 rows; Q4_0 in the reference's order), super-blocks
# (Q8_K rows), F16 and F32 (f32 rows)
EXPERT_MATMULS = [(Q.Q4_1, 6, 40, 64), (Q.Q8_0, 4, 32, 96), (Q.Q4_0, 5, 24, 64), (Q.Q4_K, 5, 16, 256),
                  (Q.Q6_K, 3, 8, 256), (Q.F16, 4, 24, 64), (Q.F32, 4, 8, 80)]

TARGETS = [Target(8, True, "f64"), Target(32, True, "fused"), Target(4, False, "unfused")]


def _exact(device) -> bool:
    return device.caps.is_cpu and device.target.fma_mode != "unfused"


def _logits(rng, n_expert: int) -> np.ndarray:
    """Router logits of every scale, with ties (equal values in a row) and an exp underflow."""
    x = (rng.standard_normal((ROWS, n_expert)) * F32(10) ** rng.integers(-2, 2, (ROWS, 1))).astype(F32)
    x[0, 1] = x[0, 0]  # a tie
    x[1, -1] = -200.0  # exp underflows to 0
    return x


def _push(rows: int) -> bytes:
    return struct.pack("<I", rows)


@pytest.mark.parametrize("target", TARGETS, ids=["lavapipe", "nvidia-like", "no-shuffle"])
def test_the_modules_are_valid_spirv(target):
    """Every MoE module, the expert variant of every matvec included, passes spirv-val (Vulkan 1.2
    rules) for targets shaped like lavapipe, an NVIDIA GPU and a device without shuffles."""
    kernels = [moe.render_softmax_gate(target, n) for n in SOFTMAX_EXPERTS]
    kernels += [moe.render_select(*s) for s in SELECTS] + [moe.render_route_weights(*w) for w in WEIGHTS]
    kernels += [moe.render_weighted_sum(*s) for s in SUMS]
    for sg in (True, False):
        kernels += [matvec.render_matvec(target, w, 40, 256, sg, experts=True) for w in matvec.SUPPORTED]
        kernels += [matvec_k.render_matvec_k(target, w, 40, 256, sg, experts=True) for w in matvec_k.SUPPORTED]
    kernels += [matvec_float.render_matvec_float(target, w, 40, 352, True, experts=True)
                for w in matvec_float.SUPPORTED]
    kernels.append(matvec_f32.render_matvec_f32(target, 40, 80, experts=True))
    for kernel in kernels:
        spirv_val(kernel.spirv)


@pytest.mark.parametrize("n_expert", SOFTMAX_EXPERTS)
def test_softmax_gate_equals_the_reference(ops, device, n_expert):
    """The softmax gate gives numerics.moe.gate's bits: the max, the blocks of 16 ggml exps each
    summed as _mm512_reduce_add_ps into a double, the libm tail, times the float of 1 / sum."""
    rng = np.random.default_rng(n_expert)
    x = np.concatenate([_logits(rng, n_expert) for _ in range(GATE_ROWS // ROWS)])  # rows whose sums round
    got = ops._run(moe.render_softmax_gate(device.target, n_expert), [x, expf_table_words()], x.shape,
                   -(-len(x) // moe.ROW_WORKGROUP), _push(len(x)))
    assert_reference(got, moe_numerics.gate(x, "softmax"), exact=_exact(device), rtol=2e-6)


@pytest.mark.parametrize("n_expert,n_used,biased", SELECTS)
def test_select_equals_the_reference(ops, n_expert, n_used, biased):
    """moe_select's kernel picks numerics.moe.top_k's experts in its order (ties to the lower expert,
    a row of equal scores included), on the probabilities plus the bias when there is one."""
    rng = np.random.default_rng(100 + n_expert)
    probs = moe_numerics.softmax_rows(_logits(rng, n_expert))
    probs[2, :] = probs[2, 0]  # a row of equal scores: the lowest experts, in order
    probs[3, 3] = probs[3, 1]
    probs[4, 1], probs[4, 2] = 0.0, -0.0  # signed zeros tie
    bias = (rng.standard_normal(n_expert) * 0.01).astype(F32)
    kernel = moe.render_select(n_expert, n_used, biased)
    got = ops._run(kernel, [probs, *((bias,) if biased else ())], (ROWS, n_used), -(-ROWS // moe.ROW_WORKGROUP),
                   _push(ROWS))
    scores = (probs + bias).astype(F32) if biased else probs
    assert np.array_equal(bits(got).astype(np.int64), moe_numerics.top_k(scores, n_used))


@pytest.mark.parametrize("n_expert,n_used,normalize,scale", WEIGHTS)
def test_route_weights_equal_the_reference(ops, device, n_expert, n_used, normalize, scale):
    """moe_weights' kernel gives numerics.moe.route_weights' bits (the sum in a double, the clamp, the
    scale), a row whose chosen probabilities sum below the clamp included."""
    rng = np.random.default_rng(200 + n_expert)
    probs = moe_numerics.softmax_rows(_logits(rng, n_expert))
    probs[4, :] = 1e-7  # a sum under F16's smallest normal: clamped
    ids = moe_numerics.top_k(probs, n_used)
    kernel = moe.render_route_weights(n_expert, n_used, normalize, scale)
    got = ops._run(kernel, [probs, ids.astype(np.uint32)], (ROWS, n_used), -(-ROWS // moe.ROW_WORKGROUP),
                   _push(ROWS))
    expected = moe_numerics.route_weights(probs, ids, normalize=normalize, scale=scale)
    assert_reference(got, expected, exact=device.caps.is_cpu, rtol=5e-7)


@pytest.mark.parametrize("n_used,width", SUMS)
def test_weighted_sum_equals_the_reference(ops, n_used, width):
    """moe_sum's kernel gives numerics.moe.weighted_sum's bits (products rounded, slots added in order)
    on every device (one IEEE operation at a time)."""
    rng = np.random.default_rng(300 + width)
    y = rng.standard_normal((ROWS, n_used * width)).astype(F32) * F32(1e3)
    w = rng.random((ROWS, n_used)).astype(F32)
    got = ops._run(moe.render_weighted_sum(n_used, width), [y, w], (ROWS, width),
                   -(-ROWS * width // moe.WORKGROUP), _push(ROWS))
    assert_reference(got, moe_numerics.weighted_sum(y, w), exact=True)


def _expert_matmul(ops, device, x: np.ndarray, stack: np.ndarray, wtype: Q, ids: np.ndarray) -> np.ndarray:
    """x f32 [rows, K], row r through expert ids[r] of the stack u8 [E, n_out, row_bytes], on the device."""
    rows, k = x.shape
    n_expert, n_out = stack.shape[:2]
    wbuf = ops.upload_weight(stack.reshape(n_expert * n_out, -1), wtype)
    xbuf, idbuf, ybuf = device.upload(x), device.upload(ids.astype(np.uint32)), device.buffer(rows * n_out * 4)
    scratch = []

    def alloc(_slot: int, nbytes: int):
        scratch.append(device.buffer(nbytes))
        return scratch[-1]

    try:
        device.run(ops.matmul_dispatches(xbuf, ybuf, wbuf, wtype, rows, k, n_out, alloc, expert_ids=idbuf))
        return ybuf.read(F32, rows * n_out).reshape(rows, n_out)
    finally:
        for buf in (wbuf, xbuf, idbuf, ybuf, *scratch):
            device.free(buf)


@pytest.mark.parametrize("wtype,n_expert,n_out,k", EXPERT_MATMULS, ids=lambda v: getattr(v, "name", str(v)))
def test_expert_matmul_equals_each_expert_alone(ops, device, wtype, n_expert, n_out, k):
    """A slot row through the weight type's matvec with the chosen experts bound equals the
    reference's product of that row with the expert it chose alone, for every expert of the stack."""
    rng = np.random.default_rng(400 + k + n_out)
    stack = np.stack([random_weight(rng, wtype, n_out, k) for _ in range(n_expert)])  # u8 [E, n_out, bytes]
    n_used = 3
    x = (rng.standard_normal((ROWS * n_used, k)) * 2).astype(F32)
    ids = np.stack([rng.permutation(n_expert)[:n_used] for _ in range(ROWS)]).reshape(-1)
    got = _expert_matmul(ops, device, x, stack, wtype, ids)
    for slot, expert in enumerate(ids):
        want = numerics.matmul(x[slot:slot + 1], numerics.DequantizedWeight(stack[expert], wtype))
        assert_reference(got[slot:slot + 1], want, exact=_exact(device), rtol=1e-5, atol=1e-5)


def test_experts_that_do_not_fit_are_refused_with_their_size():
    """Vulkan keeps every expert on the device: a stack over one binding, or experts and other weights
    over the device's memory, is refused naming the sizes and the devices that can place experts."""
    fits = dict(expert_bytes={"blk.0.ffn_up_exps.weight": 3 << 20}, other_bytes=1 << 20, device="gpu")
    check_experts_fit(**fits, heap_bytes=8 << 20, binding_bytes=4 << 20)
    with pytest.raises(Unsupported, match=r"ffn_up_exps.weight is 3.0 MiB, over one storage-buffer binding"):
        check_experts_fit(**fits, heap_bytes=8 << 20, binding_bytes=2 << 20)
    with pytest.raises(Unsupported, match=r"experts need 3.0 MiB and the other weights 1.0 MiB, more than "
                                          r"gpu's 3.5 MiB.*--device cuda"):
        check_experts_fit(**fits, heap_bytes=7 << 19, binding_bytes=4 << 20)


@pytest.mark.parametrize("caps_change,reason", [
    ({"heap_sizes": (1 << 20,)}, "Vulkan keeps every expert on the device"),
    ({"shader_float64": False}, "moe_gate's softmax sums in float64"),
])
def test_the_runner_refuses_a_moe_model_the_device_cannot_run(device, monkeypatch, caps_change, reason):
    """VulkanModel checks, before uploading, the file's expert stacks against the device's memory and
    its float64 sums against the device's features."""
    from kinetic.codegen.vulkan.model import VulkanModel
    from kinetic.frontend.gguf_file import open_gguf
    from kinetic.frontend.lower import lower
    from kinetic.runtime.weights import GGUFWeights
    from tests.synthetic import synthetic_path

    gguf = open_gguf(synthetic_path("qwen3moe"))
    monkeypatch.setattr(device, "caps", replace(device.caps, **caps_change))
    with pytest.raises(Unsupported, match=reason):
        VulkanModel(lower(gguf), GGUFWeights(gguf), device)


SIGMOID_MOE = """
%5 = param() {tensor="router"} : f32[8,64]
%6 = matmul(%4, %5) {activations="q8"} : f32[T,8]
%7 = moe_gate(%6) {gating="sigmoid"} : f32[T,8]
%18 = param() {tensor="bias"} : f32[8]
%8 = moe_select(%7, %18) {n_used=3} : i32[T,3]
%10 = moe_weights(%7, %8) {normalize=true, scale=2.5} : f32[T,3]
%11 = param() {tensor="gate_exps"} : q4_0[8,32,64]
%12 = param() {tensor="up_exps"} : q8_0[8,32,64]
%13 = param() {tensor="down_exps"} : q4_1[8,64,32]
%14 = moe_matmul(%4, %11, %8) {activations="q8"} : f32[T,96]
%15 = moe_matmul(%4, %12, %8) {activations="q8"} : f32[T,96]
%16 = swiglu(%14, %15) : f32[T,96]
%17 = moe_matmul(%16, %13, %8) {activations="q8"} : f32[T,192]
%9 = moe_sum(%17, %10) : f32[T,64]"""
SIGMOID_PARAMS = (("router", Q.F32, (8, 64)), ("bias", Q.F32, (8,)), ("gate_exps", Q.Q4_0, (8, 32, 64)),
                  ("up_exps", Q.Q8_0, (8, 32, 64)), ("down_exps", Q.Q4_1, (8, 64, 32)))


class _StackedWeights:
    """Random tensors as a GGUF file holds them, a quantized expert stack [E, n_out, K] as raw blocks
    [E, n_out, row_bytes]."""

    def __init__(self, specs):
        from tests.random_tensors import random_tensor

        rng = np.random.default_rng(3)
        self.arrays = {}
        for name, wtype, shape in specs:
            flat = (int(np.prod(shape[:-1])), shape[-1]) if len(shape) == 3 else shape
            self.arrays[name] = random_tensor(rng, wtype, flat).reshape(*shape[:-1], -1)

    def tensor(self, name: str) -> np.ndarray:
        return self.arrays[name]


@pytest.mark.parametrize("rows", [1, 17])
def test_a_sigmoid_routed_layer_is_the_reference_on_the_runner(device, rows):
    """A MoE layer with the sigmoid gate, the selection bias, a scale and three expert types (the
    shared input copied per slot, the down projection's input one row per slot) gives the reference
    interpreter's bits through the Vulkan runner, for a pass of `rows` rows."""
    from kinetic.ir.rows import PassRows
    from kinetic.ir.text import parse_graph
    from kinetic.passes import run_pipeline
    from kinetic.runtime.engine import Engine
    from tests.codegen.test_batch_invariance_matrix import VOCAB, Case
    from tests.conftest import device_passes
    from tests.device_checks import same_bits

    case = Case(64, 64, SIGMOID_MOE, SIGMOID_PARAMS)
    graph = run_pipeline(parse_graph(case.text()), device_passes("vulkan"))
    tokens = np.random.default_rng(5).integers(0, VOCAB, rows).tolist()
    weights = _StackedWeights((("token_embd.weight", Q.Q8_0, (VOCAB, 64)), *SIGMOID_PARAMS))
    results = []
    for name in ("reference", "vulkan"):
        engine = Engine(graph, weights, n_ctx=32, batch=rows, device=name, threads=1)
        try:
            results.append(engine.forward(PassRows.chain(tokens, 0, outputs="all"), {0: engine.new_sequence()}))
        finally:
            engine.close()
    assert same_bits(*results)
