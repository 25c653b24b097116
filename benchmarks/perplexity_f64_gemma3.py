"""The gemma3 forward pass of the float64 ground truth (benchmarks/perplexity_f64.py).

Owns: Gemma 3's graph in float64, read from llama.cpp's src/models/gemma3.cpp (not copied): the
embedding times sqrt(n_embd); per layer an RMS norm, q/k/v, q and k RMS-normed per head, NeoX
rotary (base rope.freq_base_swa, default 10000, on the sliding-window layers il % 6 < 5, the file's
base on the others), q times 1/sqrt(head_dim) and attention without a further scale (keys a
window or more back hidden on sliding layers), a post-attention norm before the residual add, then
the same around a GELU-gated feed-forward (the tanh form); the output norm and the (tied) output.
The GGUF converter has folded Gemma's `1 + w` into the norm weights. Does not own loading, the
numerics variants or the scoring (perplexity_f64.py).
"""

from __future__ import annotations

import numpy as np
from perplexity_f64 import Hparams, Linear, attention, matmul, rms_norm

SWA_PATTERN = 6  # layers il % 6 == 5 are global


def rope_neox(x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
    """Rotary in the NeoX layout on x f64 [T, heads, hd]: pairs (i, i + hd/2)."""
    hd = x.shape[-1]
    theta = positions[:, None].astype(np.float64) * base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., : hd // 2], x[..., hd // 2 :]
    return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def _head_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """RMS norm over each head's values: x f64 [T, heads, hd]."""
    return x / np.sqrt((x * x).mean(axis=2, keepdims=True) + eps) * w


def forward(tokens: np.ndarray, out_rows: np.ndarray, hp: Hparams, t: dict[str, Linear], variant: str) -> np.ndarray:
    """Logits f64 [len(out_rows), n_vocab] of the given rows of one sequence starting at position 0."""
    x = t["token_embd.weight"].w[tokens] * np.sqrt(hp.n_embd)  # f64 [T, n_embd]
    n_t, pos = len(tokens), np.arange(len(tokens))
    for i in range(hp.n_layer):
        p = f"blk.{i}."
        local = hp.window > 0 and i % SWA_PATTERN < SWA_PATTERN - 1
        base = hp.rope_base_local if local else hp.rope_base
        h = rms_norm(x, t[p + "attn_norm.weight"].w, hp.eps)
        q = matmul(h, t[p + "attn_q.weight"], variant).reshape(n_t, hp.n_head, hp.head_dim)
        k = matmul(h, t[p + "attn_k.weight"], variant).reshape(n_t, hp.n_kv_head, hp.head_dim)
        v = matmul(h, t[p + "attn_v.weight"], variant).reshape(n_t, hp.n_kv_head, hp.head_dim)
        q = rope_neox(_head_norm(q, t[p + "attn_q_norm.weight"].w, hp.eps), pos, base) / np.sqrt(hp.head_dim)
        k = rope_neox(_head_norm(k, t[p + "attn_k_norm.weight"].w, hp.eps), pos, base)
        a = attention(q, k, v, hp, variant, scale=1.0, window=hp.window if local else 0)
        h = matmul(a, t[p + "attn_output.weight"], variant)
        x = x + rms_norm(h, t[p + "post_attention_norm.weight"].w, hp.eps)
        h = rms_norm(x, t[p + "ffn_norm.weight"].w, hp.eps)
        gate, up = matmul(h, t[p + "ffn_gate.weight"], variant), matmul(h, t[p + "ffn_up.weight"], variant)
        h = matmul(gelu_tanh(gate) * up, t[p + "ffn_down.weight"], variant)
        x = x + rms_norm(h, t[p + "post_ffw_norm.weight"].w, hp.eps)
    h = rms_norm(x[out_rows], t["output_norm.weight"].w, hp.eps)
    return matmul(h, t.get("output.weight", t["token_embd.weight"]), variant)
