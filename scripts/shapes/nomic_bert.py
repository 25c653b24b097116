"""nomic-bert shapes: last-token pooling, 2 layers of 3 heads x 64 (width 192), rotary base 10000."""

from shapes import encoder_ref


def shapes(sm) -> dict:
    encoder_ref.install(sm)
    qt = sm.QT
    meta = sm.std_meta("nomic-bert", n_layer=2, n_embd=192, n_head=3, n_head_kv=3, n_ff=384, rms_eps=None,
                       norm_eps=1e-12, ctx=256, rope_base=10000.0,
                       **{"attention.causal": False, "pooling_type": 3})
    meta["tokenizer.ggml.token_type_count"] = 2
    return {
        "last": (dict(tok="bpe", mode="mix", tied=True, emb_type=qt.Q8_0, encoder=True, fuse_qkv=True,
                      types=[(r"^token_types\.weight$", qt.F32)], include=[r"norm\.bias$"],
                      desc="encoder: 2 layers nomic-bert, 3 heads x 64 (width 192), ff 384, rope base 10000, "
                           "last-token pooling; legacy block types"),
                 meta),
    }
