"""granitemoe shapes: 8 experts top-2 without a shared expert (GraniteMoe, not GraniteMoeShared) over
GQA 3 at width 384 with other multipliers; 6 experts top-3 with a shared expert and a tied output.
Legacy block types throughout."""


def shapes(sm) -> dict:
    qt = sm.QT
    return {
        # 2 layers, 6 heads x 64 over 2, width 384, 8 experts top-2 (ff 96), no shared expert
        "e8": (dict(tok="bpe", mode="mix", tied=False, out_type=qt.Q8_0, emb_type=qt.Q8_0,
                    types=[(r"attn_(q|output)\.weight", qt.Q4_0), (r"attn_(k|v)\.weight", qt.Q8_0),
                           (r"ffn_(gate|up)_exps", qt.Q4_1), (r"ffn_down_exps", qt.Q5_0)],
                    desc="2 layers, GQA 6/2 x 64, width 384, MoE 8 experts top-2 (ff 96), no shared expert; "
                         "multipliers embedding 12, residual 0.22, attention 1/64, logit 8; untied; "
                         "Q4_0/Q8_0/Q4_1/Q5_0"),
               sm.std_meta("granitemoe", n_layer=2, n_embd=384, n_head=6, n_head_kv=2, n_ff=96, rms_eps=1e-5,
                           rope_base=10000.0,
                           **{"embedding_scale": 12.0, "residual_scale": 0.22, "attention.scale": 0.015625,
                              "logit_scale": 8.0, "expert_count": 8, "expert_used_count": 2})),
        # 2 layers, 4 heads x 64 over 2, 6 experts top-3 (ff 64) plus a shared expert (ff 128), tied output
        "shared": (dict(tok="bpe", mode="mix", tied=True, emb_type=qt.Q8_0,
                        types=[(r"attn_(q|k|v|output)\.weight", qt.Q8_0), (r"ffn_.*_exps", qt.Q4_0),
                               (r"ffn_.*_shexp", qt.Q5_0)],
                        desc="2 layers, GQA 4/2 x 64, MoE 6 experts top-3 (ff 64) + shared expert (ff 128); "
                             "multipliers embedding 4, residual 0.3, attention 1/80, logit 2; tied; Q8_0/Q4_0/Q5_0"),
                   sm.std_meta("granitemoe", n_layer=2, n_ff=64, rms_eps=1e-5, rope_base=10000.0,
                               **{"embedding_scale": 4.0, "residual_scale": 0.3, "attention.scale": 0.0125,
                                  "logit_scale": 2.0, "expert_count": 6, "expert_used_count": 3,
                                  "expert_shared_feed_forward_length": 128})),
    }
