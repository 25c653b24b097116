"""Attention over an f16 KV cache, the C library's expf, the cache store and the embedding lookup on the
Vulkan device, against the IR reference (`numerics.attention_online`, the C library's expf,
numpy's f16 rounding, `quants.dequantize_rows`) on random inputs.

Every kernel here follows the reference's operations in its order with fmas that round once and
glibc's expf formed exactly (attention.py), so the results are bit for bit the reference's on any
device with IEEE double and float arithmetic (lavapipe; the one division, 1/S, is IEEE there)."""

from __future__ import annotations

import numpy as np
import pytest
from vulkan_helpers import assert_reference, spirv_val

from kinetic.codegen.common import expf
from kinetic.codegen.vulkan import attention, gather
from kinetic.ir import numerics
from kinetic.ir.ops import AttentionAttrs
from kinetic.ir.quants import dequantize_rows

F32 = np.float32


def _exact(device) -> bool:
    return device.target.fma_mode != "unfused" and device.caps.is_cpu


def _case(seed: int, rows: int, n: int, a: AttentionAttrs, p_visible: float = 0.7):
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((rows, a.n_head * a.head_dim)) * 2).astype(F32)
    keys = rng.standard_normal((n, a.n_kv_head * a.head_dim)).astype(np.float16)
    vals = rng.standard_normal((n, a.n_kv_head * a.head_dim)).astype(np.float16)
    visible = rng.random((rows, n)) < p_visible
    return q, keys, vals, visible


def _chain_visibility(n_committed: int, rows: int, window: int) -> np.ndarray:
    """A chain of rows at positions n_committed.. over committed keys at 0..n_committed-1 then the
    pass's rows (kinetic.ir.rows.visibility for one sequence's chain)."""
    pos = np.arange(n_committed + rows)
    row_pos = pos[n_committed:, None]
    seen = pos[None, :] <= row_pos
    if window:
        seen &= pos[None, :] > row_pos - window
    return seen


def test_kernels_pass_spirv_val(device):
    """The attention, expf, KV store, embedding, take_rows and place_columns modules are valid SPIR-V
    for Vulkan 1.2."""
    for kernel in (attention.render_attention(device.target, 9, 3, 64, 0.125), attention.render_expf_map(),
                   gather.render_kv_store(192), gather.render_embed_q8_0(576), gather.render_take_rows(576),
                   gather.render_place_columns(5, 12)):
        spirv_val(kernel.spirv)


def test_expf_matches_the_c_library(ops, device):
    """The device's expf_libc is the C library's expf bit for bit on the attention's range (<= 0,
    including glibc's underflow paths), on large positive values, on -inf, and on the two inputs
    where glibc's non-FMA build differs (z's rounding)."""
    rng = np.random.default_rng(3)
    special = np.array([0.0, -0.0, -np.inf, np.inf, 88.8, 89.0, -87.0, -88.0, -103.0, -103.9, -104.5, -200.0], F32)
    sse2 = np.array(expf.SSE2_DIFFERS, np.uint32).view(F32)
    x = np.concatenate([-rng.random(100_000).astype(F32) * 105, (rng.standard_normal(20_000) * 30).astype(F32),
                        special, sse2])
    got = ops.expf(x)
    assert_reference(got, numerics.libm_f32("expf", x), exact=device.caps.is_cpu, rtol=1e-6)


@pytest.mark.parametrize("n_head, n_kv_head, head_dim", [(6, 2, 128), (9, 3, 64), (4, 4, 64)])
def test_attention_matches_reference_on_random_masks(ops, device, n_head, n_kv_head, head_dim):
    """Random visibility (including rows that see nothing: output 0, and keys masked out before the
    first visible one), GQA and 1-2 chunks of 64 per head: the reference's bits."""
    a = AttentionAttrs(n_head=n_head, n_kv_head=n_kv_head, head_dim=head_dim, scale=1 / np.sqrt(head_dim))
    q, keys, vals, visible = _case(n_head, rows=5, n=37, a=a)
    visible[3] = False
    visible[4, :20] = False
    got = ops.attention(q, keys, vals, visible, a)
    assert_reference(got, numerics.attention_online(q, keys, vals, visible, a), _exact(device), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("window", [0, 5])
def test_attention_over_a_chain_with_committed_cache(ops, device, window):
    """A pass's chain of rows over a committed cache, each seeing the cache and the earlier rows
    (inside an optional sliding window), with large scores that make new maxima and underflowing
    exponentials: the reference's bits."""
    a = AttentionAttrs(n_head=9, n_kv_head=3, head_dim=64, scale=0.125, window=window)
    q, keys, vals, _ = _case(11, rows=6, n=30, a=a)
    q *= 8  # scores of tens: new maxima rescale the accumulator, old keys' weights underflow
    visible = _chain_visibility(24, 6, window)
    got = ops.attention(q, keys, vals, visible, a)
    assert_reference(got, numerics.attention_online(q, keys, vals, visible, a), _exact(device), rtol=1e-5, atol=1e-6)


def test_attention_row_in_a_batch_equals_the_row_alone(ops):
    """Batch invariance: each row of a pass of several gets the bits it gets computed alone."""
    a = AttentionAttrs(n_head=9, n_kv_head=3, head_dim=64, scale=0.125)
    q, keys, vals, _ = _case(5, rows=4, n=12, a=a)
    visible = _chain_visibility(8, 4, 0)
    batch = ops.attention(q, keys, vals, visible, a)
    for r in range(4):
        alone = ops.attention(q[r : r + 1], keys, vals, visible[r : r + 1], a)
        assert np.array_equal(batch[r : r + 1].view(np.uint32), alone.view(np.uint32))


def test_attention_refuses_softcap_and_odd_heads(device):
    """Soft-capping (the C library's tanhf) and heads that are not whole chunks of 64 are refused."""
    from kinetic.codegen.vulkan.device import Unsupported

    with pytest.raises(Unsupported, match="soft-capping"):
        attention.render_attention(device.target, 8, 4, 64, 0.125, softcap=50.0)
    with pytest.raises(Unsupported, match="head size 80"):
        attention.render_attention(device.target, 8, 4, 80, 0.125)


def test_kv_store_rounds_to_f16_like_numpy(ops):
    """f32 rows stored into chosen cache rows are numpy's f16 rounding (half to even, overflow to
    inf, subnormals); other cache rows are untouched."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 192)) * 100).astype(F32)
    x[0, :6] = [65519.0, 65520.0, 1e-7, -3e-8, 2.0**-25, 1.00048828125]  # ties, overflow, f16 subnormals
    cache = rng.standard_normal((10, 192)).astype(np.float16)
    slots = np.array([7, 2, 5])
    expected = cache.copy()
    with np.errstate(over="ignore"):
        expected[slots] = x.astype(np.float16)
    got = ops.kv_store(x, slots, cache)
    assert np.array_equal(got.view(np.uint16), expected.view(np.uint16))


def test_embed_q8_0_matches_dequantize_rows(ops):
    """Rows of a Q8_0 table (random quants and scales) looked up by id are dequantize_rows' values."""
    from gguf import GGMLQuantizationType as Q
    from vulkan_helpers import random_weight

    raw = random_weight(np.random.default_rng(9), Q.Q8_0, 50, 576)
    ids = np.array([0, 49, 7, 7, 23], np.int32)
    got = ops.embed_q8_0(raw, ids)
    expected = dequantize_rows(raw, Q.Q8_0, ids).reshape(len(ids), -1)
    assert np.array_equal(got.view(np.uint32), expected.astype(F32).view(np.uint32))


def test_embedding_split_across_bindings_and_placed_columns(ops, device):
    """A Q8_0 table in two parts (one dispatch each, rows outside a part left alone) gives
    dequantize_rows' rows, and place_columns puts a part's matmul columns in place: what the model
    runner does with a weight larger than one binding."""
    import struct

    from gguf import GGMLQuantizationType as Q
    from vulkan_helpers import random_weight

    from kinetic.codegen.vulkan.device import Dispatch

    raw = random_weight(np.random.default_rng(4), Q.Q8_0, 40, 64)
    ids = np.array([39, 0, 17, 24, 25], np.uint32)
    parts = [(0, 24), (24, 16)]
    bufs = [ops.upload_weight(raw[a : a + c], Q.Q8_0) for a, c in parts]
    id_buf, out = device.upload(ids), device.buffer(len(ids) * 64 * 4)
    embed = gather.render_embed_q8_0(64)
    device.run([Dispatch(embed, [b, id_buf, out], (1 + len(ids) * 64 // gather.WORKGROUP, 1, 1),
                         struct.pack("<3I", len(ids), a, c)) for b, (a, c) in zip(bufs, parts, strict=True)])
    expected = dequantize_rows(raw, Q.Q8_0, ids.astype(np.int64)).reshape(len(ids), -1).astype(F32)
    assert np.array_equal(out.read(F32, ids.size * 64).reshape(len(ids), 64), expected)
    part = np.arange(3 * 5, dtype=F32).reshape(3, 5)
    src, dst = device.upload(part), device.upload(np.zeros((3, 12), F32))
    device.run([Dispatch(gather.render_place_columns(5, 12), [src, dst], (1, 1, 1), struct.pack("<2I", 3, 7))])
    placed = np.zeros((3, 12), F32)
    placed[:, 7:] = part
    assert np.array_equal(dst.read(F32, 36).reshape(3, 12), placed)
    for b in [*bufs, id_buf, out, src, dst]:
        device.free(b)
