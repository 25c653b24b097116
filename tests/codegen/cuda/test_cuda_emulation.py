"""The generated CUDA kernels, run on the host through the lockstep warp emulation, against the IR
reference (kinetic/ir/numerics.py, interpreter.py).

Every kernel sums in the reference's order, so results must be equal bit for bit (attention too: the
score in ggml_vec_dot_f16's order, the C library's expf, the f16 accumulator), except RMS norm,
whose float64 sum of squares runs in a fixed tree instead of numpy's pairwise order: it is held to
one float32 ulp (and has been equal on every input seen; see pointwise.py)."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_helpers import (
    ATTENTIONS,
    CACHE_CAPACITY,
    ELEMENTWISE_WIDTH,
    GEMV_SHAPES,
    NORMS,
    QUANTIZE_WIDTHS,
    ROPES,
    TYPES,
    attention_inputs,
    cache_with_garbage,
    edge_values,
    elementwise_case,
    kernel_attention,
    kernel_elementwise,
    kernel_matmul,
    kernel_rms_norm,
    kernel_rope,
    quantize_rows,
    random_weight,
    reference_attention,
    reference_matmul,
)

from kinetic.codegen.cuda import pointwise
from kinetic.ir import numerics
from kinetic.ir.interpreter import evaluate
from kinetic.ir.ops import Op, RopeAttrs
from tests.device_checks import same_bits
from tests.rotary_cases import SCALINGS, scaled


@pytest.mark.parametrize("wtype", TYPES, ids=lambda t: t.name)
def test_gemv_equals_reference_bit_for_bit(host, wtype):
    """Quantizer + GEMV kernels give numerics.matmul's result bit for bit, for every format and shape
    (outputs not filling a block, one and several blocks, 1 to 5 rows)."""
    rng = np.random.default_rng(10 + TYPES.index(wtype))
    for (n, k), rows in zip(GEMV_SHAPES[wtype], (1, 3, 5), strict=True):
        raw = random_weight(rng, wtype, n, k)
        x = rng.standard_normal((rows, k)).astype(np.float32)
        x[0, :4] = [0.0, 0.0, 0.0, 0.0]
        y = kernel_matmul(host, np, x, raw, wtype)
        ref = reference_matmul(x, raw, wtype)
        bad = np.argwhere(y.view(np.uint32) != ref.view(np.uint32))
        first = tuple(bad[0]) if len(bad) else None
        assert not len(bad), f"{wtype.name} n={n} k={k}: {len(bad)} differ, first {first}: {y[first]} vs {ref[first]}"


@pytest.mark.parametrize("fmt", sorted(QUANTIZE_WIDTHS))
def test_quantizers_equal_reference(host, fmt):
    """The activation quantizers give numerics' int8 values, scales (and Q8_1 sums) exactly, also for
    an all-zero block and ties for the largest magnitude (Q8_K takes the first, with its sign)."""
    rng = np.random.default_rng(3)
    for k in QUANTIZE_WIDTHS[fmt]:
        x = rng.standard_normal((3, k)).astype(np.float32)
        x[1, :32] = 0.0
        x[2, 5], x[2, 9] = -8.0, 8.0  # a tie of magnitudes: the first (negative) one decides the sign
        got = quantize_rows(host, np, x, fmt)
        q, d = (numerics.quantize_q8_k if fmt == "q8_k" else numerics.quantize_q8_0)(x)
        assert np.array_equal(got[0], q.reshape(x.shape)), f"{fmt} k={k}: quants differ"
        assert same_bits(got[1], d), f"{fmt} k={k}: scales differ"
        if fmt == "q8_1":
            assert same_bits(got[2], numerics.q8_1_sums(x)), f"q8_1 k={k}: sums differ"


@pytest.mark.parametrize("op", sorted(pointwise.ELEMENTWISE))
def test_elementwise_equals_reference(host, op):
    """Elementwise kernels (ggml's exp polynomial for SiLU, its f16 table for GELU) equal the
    interpreter's ops bit for bit, edge values included (zeros, subnormals, +-10, overflow); a
    broadcast op (add_bias) reads one row as its second operand."""
    rng = np.random.default_rng(4)
    a = edge_values(rng, 3, ELEMENTWISE_WIDTH)
    b, ref = elementwise_case(op, a, (rng.standard_normal(a.shape) * 4).astype(np.float32))
    assert same_bits(kernel_elementwise(host, np, op, a, b), ref)


@pytest.mark.parametrize("width,eps,group,weighted", NORMS)
def test_rms_norm_within_one_ulp(host, width, eps, group, weighted):
    """RMS norm (per row or per group, with or without weight) is within one float32 ulp of the
    reference: the float64 sum of squares is summed in another order (see the module docstring)."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((4, width)) * 3).astype(np.float32)
    x[1] *= 1e-3
    w = rng.standard_normal(group or width).astype(np.float32) if weighted else None
    got = kernel_rms_norm(host, np, x, eps, group, w)
    ref = numerics.rms_norm(x, eps, group)
    if weighted:
        ref = (ref.reshape(4, -1, w.size) * w).reshape(x.shape).astype(np.float32)
    ulps = np.abs(got.view(np.int32).astype(np.int64) - ref.view(np.int32).astype(np.int64))
    assert ulps.max() <= 1, f"{ulps.max()} ulps"


@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("n_head,head_dim,n_rot,neox", ROPES)
def test_rope_equals_reference(host, n_head, head_dim, n_rot, neox, scaling):
    """Rotary kernels (normal and NeoX pairs, partial rotation) over the runner's cos/sin tables
    equal the interpreter bit for bit, with each rotary scaling (in the tables)."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, n_head * head_dim)).astype(np.float32)
    pos = np.array([0, 17, 40000], np.int32)
    a = scaled(RopeAttrs(n_head=n_head, head_dim=head_dim, n_rot=n_rot, theta=10000.0, neox=neox), scaling)
    got = kernel_rope(host, np, x, pos, n_head, head_dim, n_rot, neox, rotary=a.rotary)
    assert same_bits(got, evaluate(Op.ROPE, [x, pos], a))


@pytest.mark.parametrize("wtype", TYPES, ids=lambda t: t.name)
def test_thread_order_does_not_matter(host, host_forward, wtype):
    """Running warps and lanes forward instead of in reverse changes nothing: no result depends on an
    order of threads the hardware does not promise."""
    rng = np.random.default_rng(7)
    n, k = GEMV_SHAPES[wtype][-1]
    raw = random_weight(rng, wtype, n, k)
    x = rng.standard_normal((2, k)).astype(np.float32)
    assert same_bits(kernel_matmul(host, np, x, raw, wtype), kernel_matmul(host_forward, np, x, raw, wtype))


def test_norm_thread_order_does_not_matter(host, host_forward):
    """The RMS norm's cross-warp sum (shared memory and a barrier) gives the same bits in both orders."""
    rng = np.random.default_rng(8)
    width, eps, group, _ = NORMS[1]
    x = rng.standard_normal((3, width)).astype(np.float32)
    assert same_bits(kernel_rms_norm(host, np, x, eps, group), kernel_rms_norm(host_forward, np, x, eps, group))


@pytest.mark.parametrize("n_head,n_kv_head,head_dim", ATTENTIONS)
def test_attention_equals_reference(host, n_head, n_kv_head, head_dim):
    """Attention over an f16 cache equals numerics.attention_online bit for bit: grouped and plain
    heads, head sizes 64 to 256, causal visibility with a hidden key."""
    rng = np.random.default_rng(9)
    q, keys, values, visible = attention_inputs(rng, 3, 37, n_head, n_kv_head, head_dim)
    got = kernel_attention(host, np, q, keys, values, visible, n_head, n_kv_head, head_dim)
    assert same_bits(got, reference_attention(q, keys, values, visible, n_head, n_kv_head, head_dim))


def test_attention_thread_order_does_not_matter(host, host_forward):
    """Attention gives the same bits with warps and lanes forward and in reverse."""
    rng = np.random.default_rng(10)
    shape = ATTENTIONS[0]
    inputs = attention_inputs(rng, 2, 20, *shape)
    assert same_bits(kernel_attention(host, np, *inputs, *shape), kernel_attention(host_forward, np, *inputs, *shape))


@pytest.mark.parametrize("n_head,n_kv_head,head_dim", ATTENTIONS)
def test_attention_reads_only_the_cached_keys(host, host_forward, n_head, n_kv_head, head_dim):
    """Over a cache of CACHE_CAPACITY rows holding fewer keys (meta[0] < capacity, the mask's stride
    larger than the keys), attention equals the reference on the held keys in both thread orders:
    rows past meta[0] (f16 garbage: NaNs, infinities) and their mask entries (all visible) do not
    matter."""
    rng = np.random.default_rng(11)
    shape = (n_head, n_kv_head, head_dim)
    q, keys, values, visible = attention_inputs(rng, 3, 29, *shape)
    ref = reference_attention(q, keys, values, visible, *shape)
    cache_k, cache_v, mask = cache_with_garbage(rng, keys, values, visible)
    for prog in (host, host_forward):
        assert same_bits(kernel_attention(prog, np, q, cache_k, cache_v, mask, *shape, n_keys=29), ref)


def test_attention_sees_no_key_past_the_mask_stride(host):
    """meta[0] above the mask's stride counts as the stride: the kernel stays inside its mask row and a
    cache of CACHE_CAPACITY rows (the emulation would raise on any read past them) and gives the
    result of a full cache."""
    rng = np.random.default_rng(12)
    shape = ATTENTIONS[0]
    q, keys, values, visible = attention_inputs(rng, 2, CACHE_CAPACITY, *shape)
    full = kernel_attention(host, np, q, keys, values, visible, *shape)
    assert same_bits(full, reference_attention(q, keys, values, visible, *shape))
    assert same_bits(kernel_attention(host, np, q, keys, values, visible, *shape, n_keys=CACHE_CAPACITY + 5), full)
