"""falcon-h1 shapes: a state that is not a whole number of 64-chunks, no ssm_norm."""


def shapes(sm) -> dict:
    return {
        # 2 layers of attention (4 heads x 64 over 1) beside Mamba-2 with d_inner 384 (12 heads x 32),
        # a state of 96 (one chunk of 64, then 32 scalar fmas), a 3-tap conv, no ssm_norm;
        # tied output; mixed legacy types
        "s96": (dict(tok="bpe", mode="mix", tied=True, emb_type=sm.QT.Q8_0, exclude=[r"ssm_norm"],
                     desc="2 layers, attention GQA 4/1 beside mamba2 (12 heads x 32, d_state 96, conv 3, "
                          "no ssm_norm); tied; mixed legacy types"),
                sm.std_meta("falcon-h1", n_layer=2, n_head=4, n_head_kv=1, head_dim=64, rms_eps=1e-5, n_ff=384,
                            rope_base=10000.0,
                            **{"ssm.conv_kernel": 3, "ssm.inner_size": 384, "ssm.state_size": 96,
                               "ssm.time_step_rank": 12, "ssm.group_count": 1})),
    }
