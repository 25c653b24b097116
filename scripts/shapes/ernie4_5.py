"""ernie4_5 shapes: multi-head attention of 4 heads x 64 with legacy block types, untied output."""


def shapes(sm) -> dict:
    qt = sm.QT
    return {
        # 2 layers, 4 heads x 64, MHA (no GQA), untied output, legacy block types
        "mha": (dict(tok="bpe", mode="mix", tied=False, out_type=qt.Q8_0, emb_type=qt.Q8_0,
                     types=[(r"attn_(q|k)\.weight", qt.Q5_0), (r"attn_v\.weight", qt.Q8_0),
                            (r"attn_output", qt.Q4_0), (r"ffn_(gate|up)", qt.Q4_1), (r"ffn_down", qt.Q5_0)],
                     desc="2 layers, 4 heads x 64, MHA 4/4, rope 500000, untied output, Q5_0/Q8_0/Q4_0/Q4_1"),
                sm.std_meta("ernie4_5", n_layer=2, n_embd=256, n_head=4, n_head_kv=4, head_dim=64, n_ff=512,
                            rms_eps=1e-5, rope_base=500000.0)),
    }
