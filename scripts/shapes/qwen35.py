"""qwen35 shapes: Gated DeltaNet with value heads three to a key head (ggml's modulo broadcast), a
state of 96 (one chunk of 64, then a vectorized tail), every other layer attention, no prediction
block, tied output."""


def shapes(sm) -> dict:
    return {
        # 3 layers: GDN, attention, GDN (full_attention_interval 2); GDN 2 key heads and 6 value heads
        # of 96, conv 3; attention 4 heads x 64 over 1 KV head with an output gate, rotary over 32 of
        # 64 values, IMROPE sections [2,2,2,0]; no MTP block; tied output; mixed legacy types
        "s96": (dict(tok="bpe", mode="mix", tied=True, emb_type=sm.QT.Q8_0,
                     desc="3 layers: GDN, attn, GDN (interval 2); GDN 2 k-heads, 6 v-heads x 96, conv 3; "
                          "attn 4 heads x 64 over 1 KV head, rope 32 dims, sections [2,2,2,0]; no MTP; tied"),
                sm.std_meta("qwen35", n_layer=3, n_head=4, n_head_kv=1, head_dim=64, n_ff=384,
                            rope_base=1000000.0,
                            **{"full_attention_interval": 2, "rope.dimension_count": 32,
                               "rope.dimension_sections": [2, 2, 2, 0], "ssm.conv_kernel": 3,
                               "ssm.inner_size": 576, "ssm.state_size": 96, "ssm.time_step_rank": 6,
                               "ssm.group_count": 2})),
    }
