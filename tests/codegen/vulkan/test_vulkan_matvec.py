"""Quantized matrix-vector products (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K, Q5_K, Q3_K, Q2_K) on the Vulkan device
against `numerics.matmul` (activations quantized to Q8_0 / Q8_1 / Q8_K on the device first), batch
invariance, and refusals.

The kernels follow the reference's order (ggml's 8 lanes and horizontal sum, or the one-accumulator
gemv order where the reference uses it: Q4_K, and Q4_0 where the reference follows the repacked
kernel) with fmas that round once, so they are bit-identical to it where division is IEEE (lavapipe;
the activation quantizers divide). Elsewhere a 2.5-ulp division may move one activation quant by
one, so the comparison allows that much: 1e-3 of the row's largest magnitude. Weights are random
bytes (every bit pattern of quants and packed scales) with N(0, 0.02) f16 scales."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from vulkan_helpers import assert_reference, bits, random_weight

from kinetic import hub
from kinetic.codegen.vulkan.builders import Target
from kinetic.codegen.vulkan.device import Unsupported, VulkanError
from kinetic.codegen.vulkan.ops import SUPPORTED_WEIGHTS as SUPPORTED
from kinetic.ir import numerics

F32 = np.float32


def _weights(wtype: Q, n_out: int, k: int, seed: int) -> np.ndarray:
    return random_weight(np.random.default_rng(seed), wtype, n_out, k)


def _reference(x: np.ndarray, raw: np.ndarray, wtype: Q) -> np.ndarray:
    return numerics.matmul(x, numerics.DequantizedWeight(raw, wtype))


def _check(got, ref, device):
    exact = device.caps.is_cpu and device.target.fma_mode != "unfused"
    scale = np.abs(ref).max(axis=1, keepdims=True)
    assert_reference(got, ref, exact, rtol=0, atol=float(scale.max()) * 1e-3)


@pytest.mark.parametrize("wtype", SUPPORTED, ids=[t.name for t in SUPPORTED])
@pytest.mark.parametrize("n_out,k", [(100, 768), (8, 256), (13, 1536)])
def test_matvec_matches_reference(ops, device, wtype, n_out, k):
    """Random weights and activations, output counts that leave a partial workgroup, one to 48
    blocks (1 to 6 super-blocks) per row: the reference's results."""
    raw = _weights(wtype, n_out, k, seed=n_out + k)
    x = (np.random.default_rng(k).standard_normal((3, k)) * 2).astype(F32)
    _check(ops.matmul(x, raw, wtype), _reference(x, raw, wtype), device)


@pytest.mark.parametrize("wtype", SUPPORTED, ids=[t.name for t in SUPPORTED])
def test_subgroup_and_shared_memory_paths_agree(ops, wtype):
    """The subgroup butterfly and the shared-memory fallback sum the same lanes in the same order:
    bit-identical results."""
    raw = _weights(wtype, 40, 512, seed=3)
    x = np.random.default_rng(4).standard_normal((2, 512)).astype(F32)
    ops.use_subgroups = True
    a = ops.matmul(x, raw, wtype)
    ops.use_subgroups = False
    b = ops.matmul(x, raw, wtype)
    np.testing.assert_array_equal(bits(a), bits(b))


@pytest.mark.parametrize("wtype", SUPPORTED, ids=[t.name for t in SUPPORTED])
def test_batch_invariance(ops, wtype):
    """A row computed in a batch of 1..8 rows is bit-identical to the row alone, and repeated runs
    give the same bits."""
    raw = _weights(wtype, 72, 512, seed=5)
    x = np.random.default_rng(6).standard_normal((8, 512)).astype(F32)
    wbuf = ops.upload_weight(raw, wtype)
    try:
        alone = np.concatenate([ops.matmul(x[r : r + 1], raw, wtype, weight_buffer=wbuf) for r in range(8)])
        for n in range(1, 9):
            np.testing.assert_array_equal(bits(ops.matmul(x[:n], raw, wtype, weight_buffer=wbuf)), bits(alone[:n]))
        np.testing.assert_array_equal(bits(ops.matmul(x, raw, wtype, weight_buffer=wbuf)), bits(alone))
    finally:
        ops.device.free(wbuf)


def test_a_device_without_exact_fma_stays_close(ops):
    """Rendered for a device whose Fma rounds twice and that has no float64 (multiply, then add),
    the result differs from the reference only by float32 rounding of the lane sums."""
    ops.target = Target(ops.target.subgroup_size, ops.target.shuffle, "unfused")
    for wtype in SUPPORTED:
        raw = _weights(wtype, 24, 1024, seed=7)
        x = np.random.default_rng(8).standard_normal((2, 1024)).astype(F32)
        ref = _reference(x, raw, wtype)
        np.testing.assert_allclose(ops.matmul(x, raw, wtype), ref, rtol=0, atol=np.abs(ref).max() * 1e-5)


@pytest.mark.parametrize("wtype", [Q.IQ4_XS, Q.IQ3_S, Q.TQ2_0])
def test_unsupported_types_are_refused_with_the_reason(ops, wtype):
    """A weight type without a kernel is refused before anything runs, naming the type, what is
    supported, and that the op must run elsewhere."""
    raw = np.zeros((8, 256), np.uint8)
    with pytest.raises(Unsupported, match=rf"{wtype.name} weights have no Vulkan matmul kernel.*Q8_0.*another device"):
        ops.matmul(np.zeros((1, 256), F32), raw, wtype)


def test_bad_shapes_and_oversized_weights_are_refused(ops, device):
    """K that is not a whole number of blocks is refused, and so is a weight larger than one
    binding (splitting across bindings is not written yet), both with the reason."""
    with pytest.raises(Unsupported, match="multiple of 32"):
        ops.matmul(np.zeros((1, 48), F32), np.zeros((4, 54), np.uint8), Q.Q8_0)
    with pytest.raises(Unsupported, match="multiple of 256"):
        ops.matmul(np.zeros((1, 128), F32), np.zeros((4, 72), np.uint8), Q.Q4_K)
    limit = device.caps.max_storage_buffer_range
    huge = np.zeros((limit // 34 + 1, 34), np.uint8)  # untouched zero pages: no real memory
    with pytest.raises(VulkanError, match="maxStorageBufferRange"):
        ops.upload_weight(huge, Q.Q8_0)


REAL = [("smollm2-135m", "blk.0.ffn_down.weight", Q.Q4_1), ("smollm2-135m", "token_embd.weight", Q.Q8_0),
        ("gemma3-270m", "blk.0.attn_k.weight", Q.Q5_0), ("gemma3-270m", "blk.0.attn_output.weight", Q.Q4_K),
        ("gemma3-270m", "blk.0.ffn_down.weight", Q.Q6_K)]


@pytest.mark.parametrize("model,name,wtype", REAL, ids=[f"{m}:{n}" for m, n, _ in REAL])
def test_real_tensor_rows(ops, device, model, name, wtype):
    """The first 256 rows of real model tensors (every weight type the reference models use) give
    the reference's results (skipped where the model is not downloaded)."""
    from kinetic.frontend.gguf_file import GGUFFile

    try:
        path = hub.resolve_model(model)
    except Exception as exc:  # a missing model skips, any other failure is the test's
        pytest.skip(f"{model} not available: {exc}")
    gguf = GGUFFile(path)
    tensor, raw = gguf.tensors[name], np.array(gguf.array(name)[:256])
    assert tensor.type == wtype
    k = tensor.ne[0]
    x = np.random.default_rng(k).standard_normal((3, k)).astype(F32)
    _check(ops.matmul(x, raw, wtype), _reference(x, raw, wtype), device)
