"""qwen35moe shapes: 8 experts top-3 of ff 96 on the fused gate_up stack with a 128-wide gated shared
expert, every other layer attention, legacy block types, tied output."""


def shapes(sm) -> dict:
    qt = sm.QT
    return {
        # 2 layers: GDN, attention (full_attention_interval 2); GDN 2 k-heads, 4 v-heads x 64, conv 4;
        # attention 4 heads x 64 over 2 with an output gate, rope 16 dims, sections [3,3,2,0];
        # MoE 8 experts top-3 (ff 96, fused gate_up) + sigmoid-gated shared expert (ff 128); tied
        "e8": (dict(tok="bpe", mode="mix", tied=True, emb_type=qt.Q8_0,
                    types=[(r"ffn_gate_up_exps", qt.Q4_0), (r"ffn_down_exps", qt.Q4_1), (r"_shexp\.weight", qt.Q8_0)],
                    desc="2 layers: GDN, attn (interval 2); MoE 8 experts top-3 (ff 96, fused gate_up) + gated "
                         "shared expert (ff 128); tied; legacy types"),
               sm.std_meta("qwen35moe", n_layer=2, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                           rope_base=10000000.0,
                           **{"full_attention_interval": 2, "rope.dimension_count": 16,
                              "rope.dimension_sections": [3, 3, 2, 0], "ssm.conv_kernel": 4, "ssm.inner_size": 256,
                              "ssm.state_size": 64, "ssm.time_step_rank": 4, "ssm.group_count": 2,
                              "expert_count": 8, "expert_used_count": 3, "expert_feed_forward_length": 96,
                              "expert_shared_feed_forward_length": 128})),
    }
