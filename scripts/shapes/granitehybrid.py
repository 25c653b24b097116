"""granitehybrid shapes: rotary on, a larger state with smaller heads and no conv bias, llama-quantize
Q4_K_M."""


def shapes(sm) -> dict:
    return {
        # 3 layers: attention (4 heads x 64 over 1, interleaved rotary), then two Mamba-2 layers of 16
        # heads x 32 with a state of 128 and a 3-tap conv without bias; only logit_scale and
        # residual_scale given; tied output; Q4_K_M with a Q8_0 embedding
        "s128": (dict(tok="bpe", mode="Q4_K_M", tied=True, quantize_args=["--token-embedding-type", "q8_0"],
                      desc="3 layers: attn (GQA 4/1, rotary), mamba2, mamba2; 16 heads x 32, d_state 128, "
                           "conv 3 without bias; residual 0.5, logit 2; tied; llama-quantize Q4_K_M"),
                 sm.std_meta("granitehybrid", n_layer=3, n_head=4, n_head_kv=[1, 0, 0], rms_eps=1e-5, n_ff=384,
                             **{"residual_scale": 0.5, "logit_scale": 2.0, "ssm.conv_kernel": 3,
                                "ssm.inner_size": 512, "ssm.state_size": 128, "ssm.time_step_rank": 16,
                                "ssm.group_count": 1})),
    }
