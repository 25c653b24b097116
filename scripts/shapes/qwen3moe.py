"""qwen3moe shapes: 20 experts (a softmax over 16 vector lanes plus a tail) with top-4 and narrow
experts; 8 experts top-3 over GQA 3 at width 384 with a tied output. Legacy block types throughout.
`bench` is the decode benchmark's model of docs/moe.md (about 120 MB: move it out of tests/data)."""


def shapes(sm) -> dict:
    qt = sm.QT
    return {
        # 2 layers, 4 heads x 64 over 2, 20 experts top-4, expert ff 64
        "e20k4": (dict(tok="bpe", mode="mix", tied=False, out_type=qt.Q8_0, emb_type=qt.Q8_0,
                       types=[(r"attn_(q|output)\.weight", qt.Q4_0), (r"attn_(k|v)\.weight", qt.Q8_0),
                              (r"ffn_gate_exps", qt.Q4_1), (r"ffn_up_exps", qt.Q5_0), (r"ffn_down_exps", qt.Q8_0)],
                       desc="2 layers, GQA 4/2 x 64, q/k norm, MoE 20 experts top-4 (softmax over 16 lanes + a "
                            "tail of 4), expert ff 64; untied output; Q4_0/Q8_0/Q4_1/Q5_0"),
                  sm.std_meta("qwen3moe", n_layer=2, n_head=4, n_head_kv=2, head_dim=64, rope_base=1000000.0,
                              **{"expert_count": 20, "expert_used_count": 4, "expert_feed_forward_length": 64})),
        # 2 layers, 6 heads x 64 over 2 (GQA 3), width 384, 8 experts top-3, expert ff 96, tied output
        "e8k3": (dict(tok="bpe", mode="mix", tied=True, emb_type=qt.Q8_0,
                      types=[(r"attn_(q|k)\.weight", qt.Q5_0), (r"attn_(v|output)\.weight", qt.Q8_0),
                             (r"ffn_(gate|up)_exps", qt.Q4_0), (r"ffn_down_exps", qt.Q4_1)],
                      desc="2 layers, GQA 6/2 x 64, width 384, q/k norm, MoE 8 experts top-3, expert ff 96; "
                           "tied output; Q5_0/Q8_0/Q4_0/Q4_1"),
                 sm.std_meta("qwen3moe", n_layer=2, n_embd=384, n_head=6, n_head_kv=2, head_dim=64,
                             rope_base=1000000.0,
                             **{"expert_count": 8, "expert_used_count": 3, "expert_feed_forward_length": 96})),
        # the benchmark's model (docs/moe.md): 4 layers, width 1024, 32 experts top-4 of ff 512, all Q4_0
        "bench": (dict(tok="bpe", mode="mix", tied=False, out_type=qt.Q4_0, emb_type=qt.Q4_0,
                       types=[(r"(attn_(q|k|v|output)|ffn_(gate|up|down)_exps)\.weight", qt.Q4_0)],
                       desc="benchmark: 4 layers, GQA 8/2 x 128, width 1024, 32 experts top-4, expert ff 512; Q4_0"),
                  sm.std_meta("qwen3moe", n_layer=4, n_embd=1024, n_head=8, n_head_kv=2, head_dim=128,
                              rope_base=1000000.0,
                              **{"expert_count": 32, "expert_used_count": 4, "expert_feed_forward_length": 512})),
    }
