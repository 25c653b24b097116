"""exaone4 shapes: the 64-layer case, the only one where llama.cpp uses exaone4's sliding windows
(global layers without rotary), kept tiny; and a GQA 4 file whose window keys llama.cpp ignores."""


def shapes(sm) -> dict:
    qt = sm.QT
    return {
        # 64 layers of width 128 (two heads of 64 over one KV head), window 4 on layers il % 4 != 3 (the
        # default pattern). Not one head: CUDA's one-head attention kernel spills 4 bytes on sm_90.
        "swa64": (dict(tok="bpe", mode="mix", tied=True, emb_type=qt.Q8_0,
                       types=[(r"attn_(q|k)\.weight", qt.Q8_0), (r"attn_(v|output)\.weight", qt.Q4_1),
                              (r"ffn_(gate|up)", qt.Q4_0), (r"ffn_down", qt.Q5_0)],
                       desc="64 layers, 2 heads x 64 over 1 KV head, width 128, per-head q/k norm, post-norms; "
                            "window 4 on layers il % 4 != 3 (default pattern), global layers without rotary; "
                            "tied output; Q8_0/Q4_1/Q4_0/Q5_0"),
                  sm.std_meta("exaone4", n_layer=64, n_embd=128, n_head=2, n_head_kv=1, head_dim=64, n_ff=128,
                              rms_eps=1e-5, rope_base=1000000.0, **{"attention.sliding_window": 4})),
        # 2 layers, 4 heads x 64 over one KV head; window keys present but unused (not 64 layers)
        "gqa4": (dict(tok="bpe", mode="Q4_K_M", tied=True,
                      quantize_args=["--pure", "--token-embedding-type", "q8_0"],
                      desc="2 layers, 4 heads x 64, GQA 4/1, per-head q/k norm, post-norms; window 4 and a "
                           "pattern in the file, unused by llama.cpp (not 64 layers); tied; llama-quantize "
                           "Q4_K_M --pure (all Q4_K), Q8_0 table"),
                 sm.std_meta("exaone4", n_layer=2, n_head=4, n_head_kv=1, head_dim=64, n_ff=512, rms_eps=1e-5,
                             rope_base=1000000.0,
                             **{"attention.sliding_window": 4, "attention.sliding_window_pattern": [True, True]})),
    }
