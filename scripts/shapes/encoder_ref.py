"""llama.cpp's reference outputs for embedding-model shapes (used by scripts/shapes/bert.py, nomic_bert.py
and qwen3.py's embedding shape): the generator's ref_encoder, with the pooled output read at its real
size. Under rank pooling llama_get_embeddings_seq holds n_cls_out scores, not n_embd values; the
npz gets `pK_rank_scores` then, `pK_pooled_embedding` otherwise, and always `pK_token_embeddings`
(pooling none, every token)."""

from __future__ import annotations

import os

import numpy as np

RANK = 4


def install(sm) -> None:
    """Replace the generator's ref_encoder (for this run of synth_shapes.py only)."""
    sm.ref_encoder = lambda arch, model, prompts, load_log: _ref_encoder(sm, arch, model, prompts, load_log)


def _ref_encoder(sm, arch, model, prompts, load_log):
    lib = sm.llama()
    n_embd = lib.llama_model_n_embd(model)
    pooling = sm.SPECS[arch]["meta_fn"]().get(f"{arch}.pooling_type", 1)
    n_out = lib.llama_model_n_cls_out(model) if pooling == RANK else n_embd
    arrays, flags, ctx_log = {}, {}, ""
    for pk, pr in prompts.items():
        ids = pr["ids"]
        arrays[f"{pk}_ids"] = np.asarray(ids, dtype=np.int32)
        n_log = len(sm._LOG_LINES)
        ctx, _ = sm.new_ctx(model, embeddings=True, pooling=0)  # LLAMA_POOLING_TYPE_NONE: every token
        if pk == "p0":
            ctx_log = "".join(sm._LOG_LINES[n_log:])
        sm.decode_tokens(ctx, ids, 0, want_all=True)
        tok = np.stack([np.ctypeslib.as_array(lib.llama_get_embeddings_ith(ctx, i), shape=(n_embd,)).copy()
                        for i in range(len(ids))]).astype(np.float32)
        lib.llama_free(ctx)
        ctx, _ = sm.new_ctx(model, embeddings=True, pooling=-1)  # the file's pooling
        sm.decode_tokens(ctx, ids, 0, want_all=True)
        pooled = np.ctypeslib.as_array(lib.llama_get_embeddings_seq(ctx, 0), shape=(n_out,)).copy().astype(np.float32)
        lib.llama_free(ctx)
        arrays[f"{pk}_token_embeddings"] = tok
        arrays[f"{pk}_rank_scores" if pooling == RANK else f"{pk}_pooled_embedding"] = pooled
        flags[pk] = dict(pooling_type=int(pooling), token_embedding_std=float(tok.std()))
    lib.llama_model_free(model)
    np.savez_compressed(os.path.join(sm.out_dir(arch), f"{arch}.npz"), **arrays)
    return dict(prompts=prompts, compare=flags, load_log=load_log + ctx_log, n_vocab=sm.N_VOCAB)
