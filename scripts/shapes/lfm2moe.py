"""lfm2moe shapes: every layer a mixture of experts (no leading dense layer) with a softmax gate and
the selection bias, 8 experts top-3, legacy block types."""


def shapes(sm) -> dict:
    qt = sm.QT
    return {
        # 3 layers: shortconv, attention (4 heads x 64 over 2), shortconv; all MoE: 8 experts top-3 of ff 96,
        # softmax gating (expert_gating_func 1) with exp_probs_b; untied
        "e8": (dict(tok="bpe", mode="mix", tied=False, out_type=qt.Q8_0, emb_type=qt.Q8_0,
                    types=[(r"(attn_(q|k|v|output)|shortconv\.(in|out)_proj)\.weight", qt.Q8_0),
                           (r"ffn_(gate|up)_exps", qt.Q4_0), (r"ffn_down_exps", qt.Q4_1)],
                    desc="3 layers: shortconv, attn (GQA 4/2), shortconv; every layer MoE, 8 experts top-3 "
                         "(ff 96), softmax gating + exp_probs_b; untied; Q8_0/Q4_0/Q4_1"),
               sm.std_meta("lfm2moe", n_layer=3, n_head=4, n_head_kv=[0, 2, 0], n_ff=256, rms_eps=1e-5,
                           rope_base=1000000.0,
                           **{"shortconv.l_cache": 3, "leading_dense_block_count": 0, "expert_count": 8,
                              "expert_used_count": 3, "expert_feed_forward_length": 96,
                              "expert_gating_func": 1})),
    }
