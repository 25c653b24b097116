"""lfm2 shapes: a 20-tap short convolution (16 rounded products, then 4 fmas) beside a sliding-window
attention layer of one KV head, llama-quantize Q4_K_M."""


def shapes(sm) -> dict:
    return {
        # 3 layers: attention (4 heads x 64 over 1 KV head, window 5), then two short convolutions of
        # 20 taps (a state of 19 rows); untied output, Q4_K_M with a Q8_0 embedding
        "k20": (dict(tok="bpe", mode="Q4_K_M", tied=False, quantize_args=["--token-embedding-type", "q8_0"],
                     desc="3 layers: attn (GQA 4/1, window 5), shortconv, shortconv; L_cache 20; untied; "
                          "llama-quantize Q4_K_M with a Q8_0 embedding"),
                sm.std_meta("lfm2", n_layer=3, n_head=4, n_head_kv=[1, 0, 0], n_ff=384, rms_eps=1e-5,
                            rope_base=10000.0, **{"shortconv.l_cache": 20, "attention.sliding_window": 5})),
    }
