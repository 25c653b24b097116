"""qwen2 shapes: GQA 4 with legacy block types and a tied output; one layer of 128-wide heads; YaRN
rotary scaling."""


def shapes(sm) -> dict:
    qt = sm.QT
    return {
        # 2 layers, 8 heads x 64 over KV 2 (GQA 4), tied output, legacy block types
        "gqa4": (dict(tok="bpe", mode="mix", tied=True, emb_type=qt.Q8_0, include=[r"attn_(q|k|v)\.bias$"],
                      types=[(r"attn_(q|output)\.weight", qt.Q4_0), (r"attn_(k|v)\.weight", qt.Q8_0),
                             (r"ffn_(gate|up)", qt.Q5_0), (r"ffn_down", qt.Q4_1)],
                      desc="2 layers, 8 heads x 64, GQA 8/2, q/k/v biases, tied output, Q4_0/Q8_0/Q5_0/Q4_1"),
                 sm.std_meta("qwen2", n_layer=2, n_embd=512, n_head=8, n_head_kv=2, n_ff=512, rope_base=10000.0)),
        # 1 layer, 2 heads x 128 over one KV head, untied output, legacy block types
        "h128": (dict(tok="bpe", mode="mix", tied=False, out_type=qt.Q8_0, emb_type=qt.Q8_0,
                      include=[r"attn_(q|k|v)\.bias$"],
                      types=[(r"attn_q\.weight", qt.Q8_0), (r"attn_k\.weight", qt.Q4_0), (r"attn_v\.weight", qt.Q4_1),
                             (r"attn_output", qt.Q5_0), (r"ffn_gate", qt.Q8_0), (r"ffn_up", qt.Q4_0),
                             (r"ffn_down", qt.Q4_1)],
                      desc="1 layer, 2 heads x 128, GQA 2/1, q/k/v biases, untied output, Q8_0/Q4_0/Q4_1/Q5_0"),
                 sm.std_meta("qwen2", n_layer=1, n_embd=256, n_head=2, n_head_kv=1, n_ff=256, rope_base=1000000.0)),
        # YaRN x4 over an original context of 64 (Qwen2.5's rope_scaling, scaled down so that the ramp
        # between interpolated and extrapolated pairs falls inside the rotated dims)
        "yarn": (dict(tok="bpe", mode="mix", tied=True, emb_type=qt.Q8_0, include=[r"attn_(q|k|v)\.bias$"],
                      types=[(r"attn_(q|output)\.weight", qt.Q8_0), (r"attn_(k|v)\.weight", qt.Q4_1),
                             (r"ffn_(gate|up)", qt.Q5_0), (r"ffn_down", qt.Q4_0)],
                      desc="2 layers, 4 heads x 64, GQA 4/2, q/k/v biases, tied output, YaRN rotary x4 "
                           "(original context 64, base 10000); Q8_0/Q4_1/Q5_0/Q4_0"),
                 sm.std_meta("qwen2", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, rope_base=10000.0,
                             **{"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                                "rope.scaling.original_context_length": 64})),
    }
