"""Text-level embeddings and reranking for `kinetic.Model` and the server: inputs (text or token ids)
to token ids, the rerank pair prompt, truncation, and the one `Embedder` a model keeps.

Owns: `EmbeddingSetup` (pooling and causality from the graph's meta, or --pooling; the longest input:
the context, and for learned positions the file's context_length), `inputs_to_ids` (texts tokenized
with their special tokens as llama-server does; token id lists checked against the vocabulary;
truncation to the limit when asked), `rerank_ids` (llama.cpp's format_prompt_rerank: the file's
"rerank" chat template when it has one, else BOS query EOS SEP document EOS as the vocabulary says).
Does not own passes, pooling or normalization (kinetic/runtime/embedding.py) or HTTP shapes
(kinetic/server/embedding_api.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kinetic.errors import KineticError
from kinetic.runtime.embedding import POOLINGS, Embedder, RankHead, is_embedding_graph


@dataclass(frozen=True)
class EmbeddingSetup:
    pooling: str
    causal: bool
    max_tokens: int


def embedding_setup(graph, gguf, *, n_ctx: int, pooling: str | None = None) -> EmbeddingSetup:
    """How the model embeds: the file's pooling unless `pooling` (--pooling) says otherwise; a decoder
    graph without embedding facts pools its last token (llama.cpp's default for causal models is
    'last' for Qwen3-Embedding-style files, which say so in pooling_type)."""
    if pooling is not None and pooling not in POOLINGS:
        raise KineticError(f"--pooling {pooling} is not one of {', '.join(POOLINGS)}",
                           "Use --pooling none, mean, cls, last or rank.")
    embedding = is_embedding_graph(graph)
    causal = graph.get_meta("causal", "true") != "false"
    chosen = pooling or (graph.get_meta("pooling") if embedding else None) or "last"
    trained = gguf.metadata.get(f"{gguf.architecture}.context_length")
    limit = min(n_ctx, int(trained)) if not causal and trained else n_ctx
    return EmbeddingSetup(chosen, causal, limit)


def make_embedder(engine, graph, gguf, setup: EmbeddingSetup) -> Embedder:
    return Embedder(engine, pooling=setup.pooling, causal=setup.causal, max_tokens=setup.max_tokens,
                    rank_head=RankHead.from_gguf(gguf))


def inputs_to_ids(tokenizer, inputs: list, *, n_vocab: int, limit: int, truncate: bool = False) -> list[list[int]]:
    """Each input (a string, or a list of token ids) as token ids: text with special tokens added and
    parsed (llama-server's tokenize_input_prompts); ids checked against the vocabulary; cut to
    `limit` tokens when `truncate` (else left for the embedder to refuse)."""
    out = []
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            ids = tokenizer.encode(item, add_special=True, parse_special=True)
        elif isinstance(item, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
            ids = [int(t) for t in item]
            bad = [t for t in ids if not 0 <= t < n_vocab]
            if bad:
                raise KineticError(f"input {i}: token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})",
                                   "Check the token ids.")
        else:
            raise KineticError(f"input {i} is neither a string nor a list of token ids",
                               "Give strings, or lists of integer token ids.")
        out.append(ids[:limit] if truncate else ids)
    return out


def rerank_ids(tokenizer, gguf, query: str, document: str) -> list[int]:
    """llama.cpp's rerank prompt for one (query, document) pair (format_prompt_rerank)."""
    template = gguf.metadata.get("tokenizer.chat_template.rerank")
    if isinstance(template, str):
        text = template.replace("{query}", query).replace("{document}", document)
        return tokenizer.encode(text, add_special=False, parse_special=True)
    vocab = tokenizer.vocab
    ids: list[int] = []
    if vocab.add_bos and vocab.bos_id is not None:
        ids.append(vocab.bos_id)
    ids += tokenizer.encode(query, add_special=False)
    eos = vocab.eos_id if vocab.eos_id is not None else vocab.sep_id
    if vocab.add_eos and eos is not None:
        ids.append(eos)
    if _adds_sep(tokenizer, gguf) and vocab.sep_id is not None:
        ids.append(vocab.sep_id)
    ids += tokenizer.encode(document, add_special=False)
    if vocab.add_eos and eos is not None:
        ids.append(eos)
    return ids


def _adds_sep(tokenizer, gguf) -> bool:
    """tokenizer.ggml.add_sep_token, else llama.cpp's default: true for WordPiece (bert) vocabularies."""
    value = gguf.metadata.get("tokenizer.ggml.add_sep_token")
    return bool(value) if value is not None else tokenizer.vocab.model == "bert"


def as_matrix(vectors: list[np.ndarray]) -> np.ndarray:
    """Pooled vectors as one f32 [n, width] array (pooling none: an object array of per-token arrays)."""
    if vectors and vectors[0].ndim == 2:
        out = np.empty(len(vectors), object)
        out[:] = vectors
        return out
    return np.stack(vectors).astype(np.float32) if vectors else np.zeros((0, 0), np.float32)
