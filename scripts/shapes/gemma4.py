"""gemma4 shapes: per-layer head counts and sizes, layers without attn_v, proportional rotary with
other factors, tied output; a llama-quantize K-quant mix with heads of 128 and 256; layers sharing
an earlier layer's KV cache; and per-layer embeddings (E2B in miniature)."""

import numpy as np


def _rope_freqs(rotated: int, halved: int):
    """rope_freqs.weight: `rotated` pairs at factor 1, `halved` at 2 (angles halved), the rest 1e30
    (not rotated: Gemma 4's "proportional" rotary)."""
    def init(rng, shape):
        n = shape[-1]
        return np.array([1.0] * rotated + [2.0] * halved + [1e30] * (n - rotated - halved), dtype=np.float32)
    return init


def _meta(sm, *, n_layer, n_head, n_head_kv, head_dim, head_dim_swa, pattern, window, softcap, n_ff=512,
          **extra):
    return sm.std_meta("gemma4", n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, n_ff=n_ff,
                       rms_eps=1e-6, rope_base=1000000.0, tok="spm",
                       **{"attention.key_length_swa": head_dim_swa, "attention.value_length_swa": head_dim_swa,
                          "attention.sliding_window": window, "attention.sliding_window_pattern": pattern,
                          "rope.freq_base_swa": 10000.0, "rope.dimension_count": head_dim,
                          "rope.dimension_count_swa": head_dim_swa, "embedding_length_per_layer_input": 0,
                          "attention.shared_kv_layers": 0, "final_logit_softcapping": softcap} | extra)


def shapes(sm) -> dict:
    qt = sm.QT
    small_embedding = (r"^token_embd\.weight$", lambda rng, sh: 0.05 * rng.standard_normal(sh))
    return {
        # 5 layers [swa, swa, full, swa, full], window 4; sliding: 4 heads x 64 over 1 KV head; full: 8 heads
        # x 128 over 2, no attn_v (values from the key projection), rope_freqs 16 pairs x1, 16 x2, 32 unrotated;
        # tied output, softcap 15, legacy block types every device runs
        "mqa": (dict(tok="spm", mode="mix", tied=True, emb_type=qt.Q8_0, include=[r"^rope_freqs\.weight$"],
                     exclude=[r"^blk\.(2|4)\.attn_v\.weight$"],
                     types=[(r"attn_q\.weight", qt.Q8_0), (r"attn_k\.weight", qt.Q4_0), (r"attn_v\.weight", qt.Q4_1),
                            (r"attn_output", qt.Q5_0), (r"ffn_gate", qt.Q4_0), (r"ffn_up", qt.Q8_0),
                            (r"ffn_down", qt.Q4_1)],
                     init=[(r"^rope_freqs\.weight$", _rope_freqs(16, 16)), small_embedding,
                           (r"layer_output_scale", lambda rng, sh: rng.uniform(0.5, 1.0, size=sh))],
                     desc="5 layers [swa,swa,full,swa,full], window 4; sliding 4 heads x 64 / 1 KV head, full "
                          "8 heads x 128 / 2 KV heads without attn_v; rope_freqs 16 x1, 16 x2, 32 x1e30; tied "
                          "output, softcap 15; Q8_0/Q4_0/Q4_1/Q5_0"),
                _meta(sm, n_layer=5, n_head=[4, 4, 8, 4, 8], n_head_kv=[1, 1, 2, 1, 2], head_dim=128,
                      head_dim_swa=64, pattern=[True, True, False, True, False], window=4, softcap=15.0, n_ff=256)),
        # 3 layers [swa, full, swa], window 6; sliding: 4 heads x 128 over 2; full: 2 heads x 256 over 1;
        # llama-quantize Q4_K_M with a Q8_0 embedding table, untied output, softcap 30
        "kquant": (dict(tok="spm", mode="Q4_K_M", tied=False, include=[r"^rope_freqs\.weight$"],
                        quantize_args=["--token-embedding-type", "q8_0"],
                        init=[(r"^rope_freqs\.weight$", _rope_freqs(32, 0)), small_embedding,
                              (r"layer_output_scale", lambda rng, sh: rng.uniform(0.5, 1.0, size=sh))],
                        desc="3 layers [swa,full,swa], window 6; sliding 4 heads x 128 / 2 KV heads, full 2 heads "
                             "x 256 / 1 KV head, rope_freqs 32 of 128 pairs rotated; untied output, softcap 30; "
                             "llama-quantize Q4_K_M, Q8_0 embedding"),
                   _meta(sm, n_layer=3, n_head=[4, 2, 4], n_head_kv=[2, 1, 2], head_dim=256, head_dim_swa=128,
                         pattern=[True, False, True], window=6, softcap=30.0)),
        # 6 layers [swa, full] x 3, window 5; the last two share KV (layer 4 reads layer 2's cache, layer 5
        # layer 3's: no attn_k/attn_v/attn_k_norm of their own); sliding 4 heads x 64 over 2, full 4 x 128 over 1;
        # untied, softcap 30, legacy block types every device runs
        "shared": (dict(tok="spm", mode="mix", tied=False, out_type=qt.Q8_0, emb_type=qt.Q8_0,
                        include=[r"^rope_freqs\.weight$"], exclude=[r"^blk\.(4|5)\.attn_(k|v|k_norm)\.weight$"],
                        types=[(r"attn_(q|output)\.weight", qt.Q4_0), (r"attn_(k|v)\.weight", qt.Q8_0),
                               (r"ffn_(gate|up)", qt.Q5_0), (r"ffn_down", qt.Q4_1)],
                        init=[(r"^rope_freqs\.weight$", _rope_freqs(16, 0)), small_embedding,
                              (r"layer_output_scale", lambda rng, sh: rng.uniform(0.5, 1.0, size=sh))],
                        desc="6 layers [swa,full]x3, window 5, the last 2 sharing the KV cache of layers 2 and 3; "
                             "sliding 4 heads x 64 / 2 KV heads, full 4 x 128 / 1; untied, softcap 30; "
                             "feed-forward 256; Q4_0/Q8_0/Q5_0/Q4_1"),
                   _meta(sm, n_layer=6, n_head=4, n_head_kv=[2, 1, 2, 1, 2, 1], head_dim=128, head_dim_swa=64,
                         pattern=[True, False] * 3, window=5, softcap=30.0, n_ff=256,
                         **{"attention.shared_kv_layers": 2})),
        # E2B in miniature: 6 layers [swa x3, full, swa, full], window 6, the last two sharing layers 2 and 3's
        # KV cache and twice as wide (feed_forward_length per layer); per-layer embeddings of 32 values
        # (per_layer_token_embd, per_layer_model_proj, per_layer_proj_norm, inp_gate/proj/post_norm per layer);
        # sliding 4 heads x 64 over 1, full 4 x 128 over 2; tied, softcap 30; Q8_0 tables, legacy block types
        "ple": (dict(tok="spm", mode="mix", tied=True, emb_type=qt.Q8_0,
                     include=[r"^rope_freqs\.weight$"], exclude=[r"^blk\.(4|5)\.attn_(k|v|k_norm)\.weight$"],
                     types=[(r"^per_layer_token_embd\.weight$", qt.Q8_0), (r"^per_layer_model_proj", qt.Q8_0),
                            (r"inp_gate", qt.Q4_1), (r"blk\.\d+\.proj\.weight", qt.Q5_0),
                            (r"attn_(q|output)\.weight", qt.Q4_0), (r"attn_(k|v)\.weight", qt.Q8_0),
                            (r"ffn_(gate|up)", qt.Q4_0), (r"ffn_down", qt.Q5_0)],
                     init=[(r"^rope_freqs\.weight$", _rope_freqs(16, 0)), small_embedding,
                           (r"layer_output_scale", lambda rng, sh: rng.uniform(0.5, 1.0, size=sh))],
                     desc="6 layers [swa,swa,swa,full,swa,full], window 6, the last 2 sharing layers 2 and 3's KV "
                          "cache with feed-forward 512 (others 256); per-layer embeddings of 32; sliding 4 heads "
                          "x 64 / 1 KV head, full 4 x 128 / 2; tied, softcap 30; Q8_0/Q4_0/Q4_1/Q5_0"),
                _meta(sm, n_layer=6, n_head=4, n_head_kv=[1, 1, 1, 2, 1, 2], head_dim=128, head_dim_swa=64,
                      pattern=[True, True, True, False, True, False], window=6, softcap=30.0,
                      n_ff=[256, 256, 256, 256, 512, 512],
                      **{"attention.shared_kv_layers": 2, "embedding_length_per_layer_input": 32})),
    }
