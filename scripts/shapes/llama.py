"""llama shapes: multi-head attention with K-quant weights (llama-quantize Q4_K_M), untied output; linear
and llama3 rotary scaling."""


def shapes(sm) -> dict:
    return {
        # 2 layers, 4 heads x 64, MHA (no GQA), 5 layers' worth of llama-quantize's Q4_K_M rules, untied
        "mha": (dict(tok="bpe", mode="Q4_K_M", tied=False,
                     desc="2 layers, 4 heads x 64, MHA 4/4, rope 10000, untied output; llama-quantize Q4_K_M"),
                sm.std_meta("llama", n_layer=2, n_head=4, n_head_kv=4, n_ff=768, rms_eps=1e-5, rope_base=10000.0)),
        # rotary scaling (docs/families.md "Rotary scaling"): linear x4 in the file's keys
        "linear": (dict(tok="bpe", mode="mix", tied=False, out_type=sm.QT.Q8_0, emb_type=sm.QT.Q8_0,
                        types=all_devices(sm.QT),
                        desc="2 layers, 4 heads x 64, GQA 4/2, linear rotary scaling x4 (rope.scaling.type linear, "
                             "factor 4); Q8_0/Q4_0/Q5_0/Q4_1"),
                   sm.std_meta("llama", n_layer=2, n_head=4, n_head_kv=2, rms_eps=1e-5, rope_base=10000.0,
                               **{"rope.scaling.type": "linear", "rope.scaling.factor": 4.0})),
        # Llama 3.1-style scaling: a rope_freqs tensor of per-pair factors, 1 for short wavelengths to 8 for long;
        # Llama 3.1's original context of 8192 scaled down to 256, so that the factors matter within the prompts
        "llama3": (dict(tok="bpe", mode="mix", tied=True, emb_type=sm.QT.Q8_0, types=all_devices(sm.QT),
                        include=[r"^rope_freqs\.weight$"], init=[(r"^rope_freqs\.weight$", _llama3_factors)],
                        desc="2 layers, 6 heads x 64, GQA 6/2, rope 10000 with llama3 frequency factors "
                             "(rope_freqs: factor 8, low 1, high 4, original context 256: 8 pairs 1, 4 ramp, 20 at 8), "
                             "tied output"),
                   sm.std_meta("llama", n_layer=2, n_embd=384, n_head=6, n_head_kv=2, rms_eps=1e-5,
                               rope_base=10000.0)),
    }


def all_devices(qt) -> list:
    """Weight types the CPU, CUDA and Vulkan all run today, one per kind of weight."""
    return [(r"attn_q\.weight", qt.Q4_0), (r"attn_k\.weight", qt.Q8_0), (r"attn_v\.weight", qt.Q5_0),
            (r"attn_output", qt.Q4_1), (r"ffn_gate", qt.Q5_0), (r"ffn_up", qt.Q8_0), (r"ffn_down", qt.Q4_0)]


def _llama3_factors(rng, shape):
    """Llama 3.1's conversion of rope_scaling {factor 8, low_freq_factor 1, high_freq_factor 4,
    original_max_position_embeddings} to per-pair factors, for base 10000 and an original context of 256."""
    import numpy as np

    n, orig = shape[-1], 256
    freqs = 1.0 / 10000.0 ** (np.arange(0, 2 * n, 2, dtype=np.float64) / (2 * n))
    wavelen = 2 * np.pi / freqs
    smooth = (orig / wavelen - 1.0) / (4.0 - 1.0)
    ramp = 1 / ((1 - smooth) / 8.0 + smooth)
    factors = np.where(wavelen < orig / 4.0, 1.0, np.where(wavelen > orig / 1.0, 8.0, ramp))
    return factors.astype(np.float32)
