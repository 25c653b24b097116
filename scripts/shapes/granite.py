"""granite shapes: other multipliers over GQA 3 with a tied output; a NoPE file (rotary off) with
the optional multipliers left out; legacy block types and Q8_0 tables, which every device runs."""


def shapes(sm) -> dict:
    qt = sm.QT
    return {
        # 2 layers, 6 heads x 64 over 2 KV heads (GQA 3), width 384, tied output
        "gqa3": (dict(tok="bpe", mode="mix", tied=True, emb_type=qt.Q8_0,
                      types=[(r"attn_(q|output)\.weight", qt.Q4_0), (r"attn_(k|v)\.weight", qt.Q8_0),
                             (r"ffn_(gate|up)", qt.Q4_1), (r"ffn_down", qt.Q5_0)],
                      desc="2 layers, 6 heads x 64, GQA 6/2, width 384; multipliers embedding 12, residual 0.22, "
                           "attention 1/64, logit 8 (divided); tied output; Q4_0/Q8_0/Q4_1/Q5_0"),
                 sm.std_meta("granite", n_layer=2, n_embd=384, n_head=6, n_head_kv=2, n_ff=768, rms_eps=1e-5,
                             rope_base=10000.0,
                             **{"embedding_scale": 12.0, "residual_scale": 0.22, "attention.scale": 0.015625,
                                "logit_scale": 8.0})),
        # 2 layers, 4 heads x 64 (MHA), no rotary (rope.scaling.finetuned false), only logit_scale given
        "nope": (dict(tok="bpe", mode="mix", tied=False, out_type=qt.Q8_0, emb_type=qt.Q8_0,
                      types=[(r"attn_(q|k)\.weight", qt.Q5_0), (r"attn_(v|output)\.weight", qt.Q8_0),
                             (r"ffn_(gate|up|down)", qt.Q4_0)],
                      desc="2 layers, 4 heads x 64, MHA 4/4, no rotary (rope.scaling.finetuned false), no "
                           "embedding/residual/attention multipliers, logit 3; untied output; Q5_0/Q8_0/Q4_0"),
                 sm.std_meta("granite", n_layer=2, n_head=4, n_head_kv=4, n_ff=512, rms_eps=1e-5,
                             **{"rope.scaling.finetuned": False, "logit_scale": 3.0})),
    }
