"""olmo2 shapes: an Olmo 3-style file (sliding window on the layers its pattern marks) with GQA and
K-quant weights (llama-quantize Q4_K_M with a Q8_0 table), which every device runs; Olmo 3's
rotary: YaRN on the global layers, plain on the sliding ones."""


def shapes(sm) -> dict:
    qt = sm.QT
    return {
        # 4 layers, 4 heads x 64 over 2 KV heads, window 4 on layers 0, 2, 3 (the file's booleans), untied
        "swa": (dict(tok="bpe", mode="Q4_K_M", tied=False, quantize_args=["--token-embedding-type", "q8_0"],
                     desc="4 layers, 4 heads x 64, GQA 4/2, full-projection q/k norm (256/128), post-norms only; "
                          "window 4 on layers 0, 2, 3 (pattern array), layer 1 global; untied; llama-quantize "
                          "Q4_K_M, Q8_0 table"),
                sm.std_meta("olmo2", n_layer=4, n_head=4, n_head_kv=2, n_ff=512, rms_eps=1e-6, rope_base=500000.0,
                            **{"attention.sliding_window": 4,
                               "attention.sliding_window_pattern": [True, False, True, True]})),
        # 4 layers, 4 heads x 64 (MHA), Olmo 3's rotary: YaRN x16 on the global layer (3), plain on the
        # sliding ones (0-2, the default pattern: no pattern key), window 6
        "yarn": (dict(tok="bpe", mode="mix", tied=False, out_type=qt.Q8_0, emb_type=qt.Q8_0,
                      types=[(r"attn_(q|k|v|output)\.weight", qt.Q4_1), (r"ffn_(gate|up)", qt.Q4_0),
                             (r"ffn_down", qt.Q5_0)],
                      desc="4 layers, 4 heads x 64, MHA; window 6 on layers 0-2 (default pattern) with plain "
                           "rotary, YaRN x16 (original context 32) on layer 3; untied; Q4_1/Q4_0/Q5_0, Q8_0 "
                           "table and output"),
                 sm.std_meta("olmo2", n_layer=4, n_head=4, n_head_kv=4, n_ff=512, rms_eps=1e-6, rope_base=500000.0,
                             **{"attention.sliding_window": 6, "rope.scaling.type": "yarn",
                                "rope.scaling.factor": 16.0, "rope.scaling.original_context_length": 32})),
    }
