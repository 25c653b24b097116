"""qwen3 shapes: heads of 128 over one KV head with legacy block types; a K-quant mix of 6 heads x 64 over 3."""


def shapes(sm) -> dict:
    qt = sm.QT
    return {
        # 2 layers, 4 heads x 128 over 1 KV head (GQA 4), q dim 512 != width 256, untied, legacy block types
        "h128": (dict(tok="bpe", mode="mix", tied=False, out_type=qt.Q8_0, emb_type=qt.Q8_0,
                      types=[(r"attn_q\.weight", qt.Q4_0), (r"attn_k\.weight", qt.Q8_0), (r"attn_v\.weight", qt.Q5_0),
                             (r"attn_output", qt.Q4_1), (r"ffn_gate", qt.Q5_0), (r"ffn_up", qt.Q4_0),
                             (r"ffn_down", qt.Q8_0)],
                      desc="2 layers, 4 heads x 128, GQA 4/1, q/k norm, q dim 512 != width 256, untied output, "
                           "Q4_0/Q8_0/Q5_0/Q4_1"),
                 sm.std_meta("qwen3", n_layer=2, n_embd=256, n_head=4, n_head_kv=1, head_dim=128, n_ff=384,
                             rope_base=1000000.0)),
        # 2 layers, 6 heads x 64 over 3 KV heads (q dim 384: attn_output rows fall back from Q4_K),
        # llama-quantize Q4_K_M with a Q8_0 embedding (tied)
        "kq": (dict(tok="bpe", mode="Q4_K_M", tied=True, quantize_args=["--token-embedding-type", "q8_0"],
                    desc="2 layers, 6 heads x 64, GQA 6/3, q/k norm, q dim 384, tied Q8_0 embedding; "
                         "llama-quantize Q4_K_M"),
               sm.std_meta("qwen3", n_layer=2, n_embd=256, n_head=6, n_head_kv=3, head_dim=64, n_ff=768,
                           rope_base=1000000.0)),
    }
