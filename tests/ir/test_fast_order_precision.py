"""The fast numerics mode loses no precision against ggml's order: on the same quantized inputs, the
reference's "block_chain" matmul and "key_chain_f16_acc32" attention are at least as close to the
float64 value of what they compute as ggml's orders are (benchmarks/numerics_op_error.py measures the
same on SmolLM2's own activations: matmuls 1.8e-7 against 2.1e-7, attention 2e-7 against 1e-3). A
rounding that does not belong (an f16 accumulator, a double rounding) shows here as a larger error,
which the perplexity cannot show: a Q8-activation model's perplexity moves by ~0.3 % on any
last-bit change (benchmarks/perplexity_f64.py --perturb)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from kinetic.ir import numerics
from kinetic.ir.numerics.activations import q8_1_sums, quantize_q8_0
from kinetic.ir.numerics.attention import attention_online
from kinetic.ir.numerics.weights import DequantizedWeight, block_minimums
from kinetic.ir.quants import dequantize
from tests.ir.test_fast_order import random_raw


def relative_rms(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.sqrt(((y.astype(np.float64) - ref) ** 2).sum() / (ref**2).sum()))


def exact_matmul(x: np.ndarray, raw: np.ndarray, wtype: Q) -> np.ndarray:
    """The float64 value of what both orders compute: the Q8_0 activations against the weights, plus
    for Q4_1 the minimum's term through Q8_1's s = f16(d * sum q), f64 [R, N]."""
    q, d = quantize_q8_0(x)
    xq = q.astype(np.float64) * d[:, :, None]  # [R, nb, 32]
    w = dequantize(raw, wtype).reshape(raw.shape[0], -1).astype(np.float64)
    y = xq.reshape(x.shape) @ w.T
    if wtype is Q.Q4_1:
        m = block_minimums(raw, wtype).astype(np.float64)  # [N, nb]
        y += (q8_1_sums(x).astype(np.float64) - xq.sum(axis=2)) @ m.T
    return y


@pytest.mark.parametrize("wtype", [Q.Q4_1, Q.Q8_0], ids=["Q4_1", "Q8_0"])
def test_block_chain_is_as_precise_as_ggml_order(wtype):
    """block_chain's error against float64 (same quantized activations) is below 1e-6 and at most
    1.25x the ggml order's, on activations with outliers as real models have."""
    rng = np.random.default_rng(7)
    k, n = 1536, 256
    x = rng.standard_normal((8, k)).astype(np.float32)
    x[:, rng.integers(0, k, 6)] *= 40  # a few large channels
    raw = random_raw(rng, wtype, n, k)
    w = DequantizedWeight(raw, wtype)
    ref = exact_matmul(x, raw, wtype)
    ggml = relative_rms(numerics.matmul(x, w), ref)
    fast = relative_rms(numerics.matmul(x, w, order="block_chain"), ref)
    assert fast < 1e-6 and fast <= 1.25 * ggml, f"block_chain {fast:.3e} against ggml's order {ggml:.3e}"


def exact_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray, a) -> np.ndarray:
    """Softmax attention in float64 on the f16-rounded q, k, v, f64 [rows, n_head*hd]."""
    rows, group = q.shape[0], a.n_head // a.n_kv_head
    qh = q.astype(np.float16).astype(np.float64).reshape(rows, a.n_head, a.head_dim)
    kh = np.repeat(k.astype(np.float64).reshape(-1, a.n_kv_head, a.head_dim), group, axis=1)
    vh = np.repeat(v.astype(np.float64).reshape(-1, a.n_kv_head, a.head_dim), group, axis=1)
    s = np.einsum("rhd,jhd->hrj", qh, kh) * np.float64(np.float32(a.scale))
    s = np.where(visible[None], s, -np.inf)
    p = np.exp(s - s.max(axis=2, keepdims=True))
    p /= p.sum(axis=2, keepdims=True)
    return np.einsum("hrj,jhd->rhd", p, vh).reshape(rows, -1)


def test_f32_accumulator_attention_is_far_more_precise():
    """key_chain_f16_acc32's error against float64 (same f16 q, k, v) is below 1e-6 and under a
    hundredth of ggml's f16-accumulator order's."""
    rng = np.random.default_rng(8)
    rows, n_keys, hd = 12, 96, 64
    a_ggml = SimpleNamespace(n_head=4, n_kv_head=2, head_dim=hd, scale=1 / 8, softcap=0.0, order="key_chain_f16")
    a_fast = SimpleNamespace(**{**vars(a_ggml), "order": "key_chain_f16_acc32"})
    q = (rng.standard_normal((rows, 4 * hd)) * 2).astype(np.float32)
    k = (rng.standard_normal((n_keys, 2 * hd)) * 2).astype(np.float16)
    v = rng.standard_normal((n_keys, 2 * hd)).astype(np.float16)
    visible = np.arange(n_keys)[None, :] <= np.arange(n_keys - rows, n_keys)[:, None]  # causal, last rows
    ref = exact_attention(q, k, v, visible, a_ggml)
    ggml = relative_rms(attention_online(q, k, v, visible, a_ggml), ref)
    fast = relative_rms(attention_online(q, k, v, visible, a_fast), ref)
    assert fast < 1e-6 and fast * 100 < ggml, f"f32 accumulator {fast:.3e} against f16's {ggml:.3e}"
