"""gemma3 shapes: grouped-query heads of 128 with a short window, legacy block types."""


def shapes(sm) -> dict:
    qt = sm.QT
    return {
        # 7 layers: layers 0-4 and 6 slide over a window of 4, layer 5 is global; 4 heads x 128 over 2 KV heads
        "gqa": (dict(tok="spm", mode="mix", tied=False, out_type=qt.Q8_0, emb_type=qt.Q8_0,
                     types=[(r"attn_(q|k|v|output)\.weight", qt.Q8_0), (r"ffn_(gate|up)", qt.Q4_0),
                            (r"ffn_down", qt.Q5_0)],
                     init=[(r"^token_embd\.weight$", lambda rng, sh: 0.05 * rng.standard_normal(sh))],
                     desc="7 layers (window 4; layer 5 global), 4 heads x 128, GQA 4/2, q/k norm, sandwich norms, "
                          "untied output, Q8_0/Q4_0/Q5_0"),
                sm.std_meta("gemma3", n_layer=7, n_embd=256, n_head=4, n_head_kv=2, head_dim=128, n_ff=512,
                            rms_eps=1e-6, rope_base=1000000.0, tok="spm",
                            **{"attention.sliding_window": 4, "rope.freq_base_swa": 10000.0})),
    }
