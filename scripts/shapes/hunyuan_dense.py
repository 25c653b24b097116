"""hunyuan-dense shapes: an NTK alpha in the file (heads of 128); a K-quant mix of 8 heads x 64 over 2."""


def shapes(sm) -> dict:
    qt = sm.QT
    return {
        # 2 layers, 4 heads x 128 over 2, rope.scaling.alpha 1000 (base 10000 -> ~1.1e7), legacy block types
        "alpha": (dict(tok="bpe", mode="mix", tied=True, emb_type=qt.Q8_0,
                       types=[(r"attn_(q|k|v)\.weight", qt.Q8_0), (r"attn_output", qt.Q4_1),
                              (r"ffn_(gate|up)", qt.Q4_0), (r"ffn_down", qt.Q5_0)],
                       desc="2 layers, 4 heads x 128, GQA 4/2, q/k norm after rope, NTK alpha 1000, "
                            "tied output, Q8_0/Q4_1/Q4_0/Q5_0"),
                  sm.std_meta("hunyuan-dense", n_layer=2, n_embd=384, n_head=4, n_head_kv=2, head_dim=128, n_ff=512,
                              rms_eps=1e-5, rope_base=10000.0, **{"rope.scaling.alpha": 1000.0})),
        # 2 layers, 8 heads x 64 over 2 KV heads, llama-quantize Q4_K_M with a Q8_0 embedding (tied)
        "gqa4": (dict(tok="bpe", mode="Q4_K_M", tied=True, quantize_args=["--token-embedding-type", "q8_0"],
                      desc="2 layers, 8 heads x 64 (q dim 512 != width 256), GQA 8/2, q/k norm after rope, "
                           "tied Q8_0 embedding; llama-quantize Q4_K_M"),
                 sm.std_meta("hunyuan-dense", n_layer=2, n_embd=256, n_head=8, n_head_kv=2, head_dim=64, n_ff=768,
                             rms_eps=1e-5, rope_base=10000.0)),
    }
