"""qwen3 shapes: heads of 128 over one KV head with legacy block types; a K-quant mix of 6 heads x 64 over 3;
a decoder embedding model (embed) and reranker (rerank)."""


def shapes(sm) -> dict:
    qt = sm.QT
    return embedding_shapes(sm) | rerank_shapes(sm) | {
        # 2 layers, 4 heads x 128 over 1 KV head (GQA 4), q dim 512 != width 256, untied, legacy block types
        "h128": (dict(tok="bpe", mode="mix", tied=False, out_type=qt.Q8_0, emb_type=qt.Q8_0,
                      types=[(r"attn_q\.weight", qt.Q4_0), (r"attn_k\.weight", qt.Q8_0), (r"attn_v\.weight", qt.Q5_0),
                             (r"attn_output", qt.Q4_1), (r"ffn_gate", qt.Q5_0), (r"ffn_up", qt.Q4_0),
                             (r"ffn_down", qt.Q8_0)],
                      desc="2 layers, 4 heads x 128, GQA 4/1, q/k norm, q dim 512 != width 256, untied output, "
                           "Q4_0/Q8_0/Q5_0/Q4_1"),
                 sm.std_meta("qwen3", n_layer=2, n_embd=256, n_head=4, n_head_kv=1, head_dim=128, n_ff=384,
                             rope_base=1000000.0)),
        # 2 layers, 6 heads x 64 over 3 KV heads (q dim 384: attn_output rows fall back from Q4_K),
        # llama-quantize Q4_K_M with a Q8_0 embedding (tied)
        "kq": (dict(tok="bpe", mode="Q4_K_M", tied=True, quantize_args=["--token-embedding-type", "q8_0"],
                    desc="2 layers, 6 heads x 64, GQA 6/3, q/k norm, q dim 384, tied Q8_0 embedding; "
                         "llama-quantize Q4_K_M"),
               sm.std_meta("qwen3", n_layer=2, n_embd=256, n_head=6, n_head_kv=3, head_dim=64, n_ff=768,
                           rope_base=1000000.0)),
    }


def embedding_shapes(sm) -> dict:
    """A decoder embedding model (Qwen3-Embedding style): qwen3 layers, the final norm's rows pooled by the
    last token as the file's pooling_type says, causal attention (tests/data/synthetic/qwen3-embed)."""
    from shapes import encoder_ref

    encoder_ref.install(sm)
    return {
        "embed": (dict(tok="bpe", mode="mix", tied=True, emb_type=sm.QT.Q8_0, encoder=True,
                       desc="decoder embedder: 2 layers qwen3, 4 heads x 64 over 2, q/k norm, pooling last "
                            "(pooling_type 3), causal; legacy block types"),
                  sm.std_meta("qwen3", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                              rope_base=1000000.0, pooling_type=3)),
    }


def rerank_shapes(sm) -> dict:
    """A decoder reranker (Qwen3-Reranker style): rank pooling over the last token through cls.output,
    2 rows (llama.cpp's converter takes the LM head's "yes" and "no" rows), softmaxed by llama.cpp."""
    from shapes import encoder_ref

    encoder_ref.install(sm)
    meta = sm.std_meta("qwen3", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                       rope_base=1000000.0, pooling_type=4)
    meta["qwen3.classifier.output_labels"] = ["yes", "no"]
    return {
        "rerank": (dict(tok="bpe", mode="mix", tied=True, emb_type=sm.QT.Q8_0, encoder=True, include=[r"^cls"],
                        desc="decoder reranker: 2 layers qwen3, 4 heads x 64 over 2, rank pooling (last token, "
                             "cls.output of 2 rows, softmax); legacy block types"),
                   meta),
    }
