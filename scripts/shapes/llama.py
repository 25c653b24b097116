"""llama shapes: multi-head attention with K-quant weights (llama-quantize Q4_K_M), untied output."""


def shapes(sm) -> dict:
    return {
        # 2 layers, 4 heads x 64, MHA (no GQA), 5 layers' worth of llama-quantize's Q4_K_M rules, untied
        "mha": (dict(tok="bpe", mode="Q4_K_M", tied=False,
                     desc="2 layers, 4 heads x 64, MHA 4/4, rope 10000, untied output; llama-quantize Q4_K_M"),
                sm.std_meta("llama", n_layer=2, n_head=4, n_head_kv=4, n_ff=768, rms_eps=1e-5, rope_base=10000.0)),
    }
