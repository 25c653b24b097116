"""bert shapes: CLS pooling at width 192 with 3 heads; a reranker (rank pooling, cls and cls_out heads)."""

from shapes import encoder_ref


def _meta(sm, *, pooling: int, n_head: int = 4, **kw) -> dict:
    m = sm.std_meta("bert", n_head=n_head, n_head_kv=n_head, rms_eps=None, norm_eps=1e-12,
                    **{"attention.causal": False, "pooling_type": pooling}, **kw)
    m["tokenizer.ggml.token_type_count"] = 2
    return m


def shapes(sm) -> dict:
    encoder_ref.install(sm)
    qt = sm.QT
    common = dict(tok="bpe", mode="mix", tied=True, emb_type=qt.Q8_0, encoder=True)
    tables = [(r"^token_types\.weight$", qt.F32), (r"^position_embd\.weight$", qt.F16)]
    return {
        # 2 layers of 3 heads x 64 (width 192), feed-forward 384, context 64, CLS pooling, Q8_0 embedding
        "cls": (dict(common, types=tables, include=[r"^(?!cls).*\.bias$"],
                     desc="encoder: 2 layers BERT, 3 heads x 64 (width 192), ff 384, context 64, CLS pooling; "
                          "legacy block types"),
                _meta(sm, pooling=2, n_layer=2, n_embd=192, n_head=3, n_ff=384, ctx=64)),
        # for benchmarks only (not under tests/data: 13 MB): MiniLM-L6's size with heads of 64, 6 layers of 6 x 64
        # (width 384), feed-forward 1536, context 512, mean pooling; benchmarks/embeddings.py
        "bench": (dict(common, types=tables, include=[r"^(?!cls).*\.bias$"],
                       desc="benchmark encoder: 6 layers BERT, 6 heads x 64 (width 384), ff 1536, context 512, mean "
                            "pooling; legacy block types"),
                  _meta(sm, pooling=1, n_layer=6, n_embd=384, n_head=6, n_ff=1536, ctx=512)),
        # a reranker: 2 layers of 4 x 64, rank pooling through cls (dense + tanh) and cls_out (one score)
        "rank": (dict(common, types=tables + [(r"^cls_out\.weight$", qt.F32)], include=[r"\.bias$", r"^cls"],
                      desc="reranker: 2 layers BERT, 4 heads x 64, rank pooling (cls dense + tanh, cls_out 1 score); "
                           "legacy block types"),
                 _meta(sm, pooling=4, n_layer=2, ctx=256)),
    }
