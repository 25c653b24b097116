"""Embeddings and reranking scores: texts (token ids) through an embedding model's graph, pooled and
normalized as llama.cpp does.

Owns: `Embedder`: packing several inputs into shared passes (an encoder's input is one whole
bidirectional pass of its own rows, kinetic/ir/rows.py `PassRows.encoder`; a causal model's rows
are each input's chain), the pooling the file (or --pooling) asks for on each input's own rows
(`pool`: none, mean, cls, last, rank), L2 normalization (`normalize`, llama.cpp's
common_embd_normalize), a reranker's classification head (`RankHead`: cls dense + tanh, cls.output),
and refusing an input longer than the context. Does not own the graph (kinetic/frontend/encoder.py
writes its embedding facts into the meta), tokenization or text (kinetic/model.py, the server).

Exactness: each input's rows see only their own sequence, every reduction is per row, and pooling
reads one input's rows only, in its own order, so an input's vector is bit for bit the one it gets
in a pass alone, however the inputs are packed.

The pooled arithmetic is llama.cpp's: mean pooling is ggml_mul_mat of the transposed rows with a
column of f32 1/n (ggml_vec_dot_f32's order, numerics.float_dot); CLS is the first row, last the last;
rank applies cls (matmul, bias, tanhf) and cls.output (matmul, bias) to the first row; normalization sums
f32 squares in float64, and multiplies by the f32 reciprocal of the root.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic.errors import KineticError
from kinetic.ir import numerics
from kinetic.ir.graph import Graph
from kinetic.ir.rows import PassRows
from kinetic.runtime.engine import Engine, Sequence

F32 = np.float32
POOLINGS = ("none", "mean", "cls", "last", "rank")
MAX_INPUTS_PER_PASS = 16  # each holds a cache of the context's size for the pass (reused, never committed)


def is_embedding_graph(graph: Graph) -> bool:
    return graph.get_meta("embedding") == "true"


class ContextExceeded(KineticError):
    """An input longer than the model's context (the server answers it in each API's shape)."""

    def __init__(self, n_tokens: int, limit: int, index: int):
        super().__init__(f"input {index} has {n_tokens} tokens, more than the context of {limit}",
                         "Shorten the input, or ask for truncation (Ollama's truncate, or truncate=true).")
        self.n_tokens, self.limit, self.index = n_tokens, limit, index


@dataclass(frozen=True)
class RankHead:
    """A reranker's classification head, dequantized once: cls (dense + tanh) then cls.output (llama.cpp's cls_out)."""

    cls: numerics.DequantizedWeight | None
    cls_bias: np.ndarray | None
    out: numerics.DequantizedWeight | None
    out_bias: np.ndarray | None
    softmax: bool = False  # llama.cpp softmaxes a qwen3 reranker's scores (its yes / no logits)

    @classmethod
    def from_gguf(cls, gguf) -> RankHead | None:
        """The head the file holds (None when it has neither cls nor cls.output)."""
        def weight(name: str):
            if name not in gguf.tensors:
                return None
            info, raw = gguf.tensors[name], np.asarray(gguf.array(name))
            rows = info.ne[1] if len(info.ne) == 2 else 1  # one score: GGUF stores [n_embd]
            return numerics.DequantizedWeight(raw.reshape(rows, -1), info.type)

        def bias(name: str):
            return np.asarray(gguf.array(name), F32).reshape(-1) if name in gguf.tensors else None

        if "cls.weight" not in gguf.tensors and "cls.output.weight" not in gguf.tensors:
            return None
        return cls(weight("cls.weight"), bias("cls.bias"), weight("cls.output.weight"), bias("cls.output.bias"),
                   softmax=gguf.architecture in ("qwen3", "qwen3vl"))

    def __call__(self, row: np.ndarray) -> np.ndarray:
        """llama.cpp's build_pooling RANK head on one pooled row f32 [n_embd]: the scores f32 [n_out]."""
        x = row[None].astype(F32)
        if self.cls is not None:
            x = numerics.matmul(x, self.cls, "q8")
            if self.cls_bias is not None:
                x = (x + self.cls_bias).astype(F32)
            x = numerics.libm_f32("tanhf", x)
        if self.out is not None:
            x = numerics.matmul(x, self.out, "q8")
            if self.out_bias is not None:
                x = (x + self.out_bias).astype(F32)
        return _soft_max(x[0]) if self.softmax else x[0]


def _soft_max(x: np.ndarray) -> np.ndarray:
    """ggml_soft_max of one row: expf(x - max) (the C library's), summed in float64, times 1/sum."""
    e = numerics.libm_f32("expf", (x - x.max()).astype(F32))
    total = np.cumsum(e.astype(np.float64))[-1]
    return (e * F32(1.0 / total)).astype(F32)


def pool(rows: np.ndarray, pooling: str) -> np.ndarray:
    """One input's hidden states f32 [n, width] pooled: f32 [width] (none: the rows themselves)."""
    if pooling == "none":
        return rows
    if pooling in ("cls", "rank"):  # rank: Embedder.scores picks a causal model's last row itself
        return rows[0]
    if pooling == "last":
        return rows[-1]
    n = rows.shape[0]
    weights = np.full((1, n), F32(1) / F32(n), F32)  # llama.cpp's inp_mean: 1.0f / n
    return numerics.float_dot(weights, np.ascontiguousarray(rows.T), Q.F32)[0]


def normalize(v: np.ndarray) -> np.ndarray:
    """L2 normalization as common_embd_normalize(..., 2): f32 squares summed in float64, times the
    f32 of 1/sqrt(sum) (0 for a zero vector). Works on the last axis."""
    v = np.asarray(v, F32)
    squares = (v * v).astype(F32).astype(np.float64)
    total = np.cumsum(squares, axis=-1)[..., -1] if v.shape[-1] else np.zeros(v.shape[:-1])
    root = np.sqrt(total)
    with np.errstate(divide="ignore"):
        inv = np.where(root > 0, 1.0 / np.where(root > 0, root, 1.0), 0.0).astype(F32)
    return (v * inv[..., None]).astype(F32)


class Embedder:
    """Inputs (token id lists) -> their hidden states, pooled vectors or rank scores (see the module)."""

    def __init__(self, engine: Engine, *, pooling: str, causal: bool, max_tokens: int,
                 rank_head: RankHead | None = None):
        if pooling not in POOLINGS:
            raise KineticError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}",
                               "Use --pooling none, mean, cls, last or rank.")
        self.engine, self.pooling, self.causal = engine, pooling, causal
        self.max_tokens = max_tokens  # the longest input: the context, and for an encoder one pass
        self.rank_head = rank_head
        self.passes = 0
        self._sequences: list[Sequence] = []  # one per input of a pass: caches the passes write, never commit
        self._lock = threading.Lock()  # one caller's passes at a time (the server calls from its threads)

    def check_lengths(self, inputs: list[list[int]]) -> None:
        """Refuse an empty input or one longer than max_tokens, naming the limit."""
        for i, ids in enumerate(inputs):
            if not ids:
                raise KineticError(f"input {i} is empty", "Give each input at least one token.")
            if len(ids) > self.max_tokens:
                raise ContextExceeded(len(ids), self.max_tokens, i)

    def hidden_states(self, inputs: list[list[int]]) -> list[np.ndarray]:
        """Each input's hidden states f32 [len, width], inputs packed into passes of at most the
        engine's rows (an input never split: its rows see each other)."""
        self.check_lengths(inputs)
        out: list[np.ndarray | None] = [None] * len(inputs)
        with self._lock:
            for group in self._groups([len(ids) for ids in inputs]):
                for i, states in zip(group, self._run([inputs[i] for i in group]), strict=True):
                    out[i] = states
        return out

    def embed(self, inputs: list[list[int]], *, normalized: bool = True) -> list[np.ndarray]:
        """Each input's pooled vector f32 [width] (pooling none: f32 [len, width], a vector per token),
        L2-normalized when asked."""
        pooled = [pool(states, self.pooling) for states in self.hidden_states(inputs)]
        return [normalize(v) if normalized else v for v in pooled]

    def scores(self, inputs: list[list[int]]) -> list[float]:
        """Rank pooling: each input's score, the classification head's first output (llama-server's
        send_rerank reads embd[0])."""
        if self.rank_head is None:
            raise KineticError("this model has no classification head (cls / cls.output) to rank with",
                               "Use a reranker model (for example bge-reranker), started with --reranking.")
        row = -1 if self.causal else 0  # llama.cpp ranks a causal model's last token, an encoder's first
        return [float(self.rank_head(states[row])[0]) for states in self.hidden_states(inputs)]

    def _groups(self, lengths: list[int]) -> list[list[int]]:
        """Inputs in order, packed so a pass holds at most max(engine.batch, the input) rows and at
        most the device's sequences."""
        limit_rows = self.engine.batch
        limit_seqs = min(self.engine.max_sequences or MAX_INPUTS_PER_PASS, MAX_INPUTS_PER_PASS)
        groups: list[list[int]] = []
        rows = 0
        for i, n in enumerate(lengths):
            if groups and rows + n <= limit_rows and len(groups[-1]) < limit_seqs:
                groups[-1].append(i)
                rows += n
            else:
                groups.append([i])
                rows = n
        return groups

    def _run(self, inputs: list[list[int]]) -> list[np.ndarray]:
        """One pass of whole inputs over empty caches, committing nothing: each input's rows."""
        while len(self._sequences) < len(inputs):
            self._sequences.append(self.engine.new_sequence())
        seqs = dict(enumerate(self._sequences[:len(inputs)]))
        rows = PassRows.encoder(inputs)
        if self.causal:  # each input a chain: row j sees rows 0..j of its own input
            rows.bidirectional = False
        states = self.engine.forward(rows, seqs, commit=False)  # f32 [T, width]: every row an output
        self.passes += 1
        starts = np.cumsum([0] + [len(ids) for ids in inputs])
        return [np.array(states[starts[i]:starts[i + 1]]) for i in range(len(inputs))]
