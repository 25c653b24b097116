"""The engine: runs passes of rows through a compiled graph and keeps sequence state.

Owns: forward passes over a batch of rows (tokens with sequence, position and parent), prompt
processing in fixed-size chunks, one-token decode, greedy selection and rollback. It knows nothing
about text: it works on token ids (the tokenizer lives in the frontend). The passes run on a device's
runner (kinetic/codegen/runner.py), opened through the device registry (kinetic/devices.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kinetic import devices
from kinetic.codegen.runner import Runner, RunnerOptions
from kinetic.ir.graph import Graph
from kinetic.ir.interpreter import WeightSource
from kinetic.ir.ops import Op
from kinetic.ir.rows import PassRows
from kinetic.runtime.kv_cache import KVCache, SequenceCaches, check_cache_fits

DEFAULT_CONTEXT = 4096
DEFAULT_BATCH = 128  # prompt rows per pass (measured: Gemma-3 pp512 +3.5% over 64, SmolLM2 even)


@dataclass
class Sequence:
    """One sequence's tokens and cache; tokens[:cache.length] are in the cache."""

    cache: KVCache
    tokens: list[int]
    pending: tuple | None = None  # the last verify() pass, (rows, new_kv, cache length), until keep()


class Engine:
    def __init__(self, graph: Graph, weights: WeightSource, *, n_ctx: int = DEFAULT_CONTEXT,
                 batch: int = DEFAULT_BATCH, device: str = "cpu", threads: int | None = None,
                 gpu_layers: int | None = None):
        self.graph = graph
        self.n_ctx = n_ctx
        self.batch = batch
        self.device = device
        self.runner: Runner = devices.open_runner(device, graph, weights,
                                                  RunnerOptions(batch, threads, n_ctx, gpu_layers))
        self.kv_width: dict[int, int] = {}
        self.kv_dtype = np.float16
        for node in graph.nodes:
            if node.op is Op.STATE:
                self.kv_width[node.attrs.layer] = node.attrs.n_kv_head * node.attrs.head_dim
            if node.op is Op.ATTENTION and node.attrs.kv_dtype == "f32":
                self.kv_dtype = np.float32
        self.n_vocab = graph.output("logits").type.shape[1]
        self.passes = 0  # forward passes run (prompt chunks, decode steps, verification passes)

    @property
    def in_place(self) -> bool:
        """The runner writes a pass's keys and values into the caches itself (commit by length)."""
        return self.runner.in_place

    def close(self) -> None:
        """Free what the runner holds on its device; the engine runs no pass after this."""
        self.runner.close()

    def new_sequence(self) -> Sequence:
        check_cache_fits(self.n_ctx, sum(self.kv_width.values()), np.dtype(self.kv_dtype).itemsize)
        return Sequence(KVCache(self.kv_width, self.n_ctx, self.kv_dtype), [])

    def forward(self, rows: PassRows, seqs: dict[int, Sequence], commit: bool = True) -> np.ndarray:
        """One pass: logits f32 [R, n_vocab] for rows.output_rows; commits every row unless told not to."""
        if commit and rows.chain_seq >= 0:
            seqs[rows.chain_seq].cache.check_room(len(rows.tokens))
        elif commit:
            for sid, s in seqs.items():
                s.cache.check_room(int(np.count_nonzero(rows.seqs == sid)))
        caches = SequenceCaches({sid: s.cache for sid, s in seqs.items()})
        result = self.runner.run(self.graph, rows, caches)
        self.passes += 1
        if commit and rows.chain_seq >= 0 and self.in_place:  # one sequence's chain: every row is its own
            s = seqs[rows.chain_seq]
            s.cache.commit_written(rows.positions)
            s.tokens.extend(rows.tokens.tolist())
        elif commit:
            for sid, s in seqs.items():
                mine = np.flatnonzero(rows.seqs == sid)
                if self.in_place:
                    s.cache.commit_written(rows.positions[mine])
                else:
                    s.cache.commit(result.new_kv, mine, rows.positions)
                s.tokens.extend(int(t) for t in rows.tokens[mine])
        return result.outputs["logits"]

    def prefill(self, seq: Sequence, tokens: list[int]) -> np.ndarray:
        """Feed tokens after what the sequence holds, in chunks; logits of the last one, f32 [n_vocab]."""
        if not tokens:
            raise ValueError("prefill needs at least one token")
        last = (len(tokens) - 1) // self.batch * self.batch
        self.feed(seq, tokens[:last])
        return self.forward(PassRows.chain(tokens[last:], seq.cache.length), {0: seq})[-1]

    def feed(self, seq: Sequence, tokens: list[int]) -> None:
        """Feed tokens in the engine's chunks without computing logits (the output layer is skipped):
        prefill's chunks before its last, or a prompt whose chunks a caller interleaves with checks."""
        for start in range(0, len(tokens), self.batch):
            self.forward(PassRows.chain(tokens[start : start + self.batch], seq.cache.length, outputs="none"),
                         {0: seq})

    def decode(self, seq: Sequence, token: int) -> np.ndarray:
        return self.prefill(seq, [token])

    def verify(self, seq: Sequence, rows: PassRows) -> np.ndarray:
        """One pass of a draft tree of one sequence (rows.seqs all 0, parents before children) that
        commits nothing: logits f32 [T, n_vocab] for rows.output_rows (all rows, for verification).
        keep() then commits the accepted path; the compiled step has already written every row in
        place at slot length + i."""
        seq.cache.check_room(len(rows.tokens))
        result = self.runner.run(self.graph, rows, SequenceCaches({0: seq.cache}))
        self.passes += 1
        seq.pending = (rows, result.new_kv, seq.cache.length)
        return result.outputs["logits"]

    def keep(self, seq: Sequence, path: list[int]) -> None:
        """Commit rows `path` of the last verify() pass (root first, each row the parent of the next)
        without recomputing them."""
        if seq.pending is None or seq.pending[2] != seq.cache.length:
            raise ValueError("keep() needs the sequence's last pass to be a verify() with nothing after it")
        rows, new_kv, _ = seq.pending
        seq.pending = None
        path = np.asarray(path, np.int64)
        if self.in_place:
            seq.cache.keep_written(path, rows.positions[path])
        else:
            seq.cache.commit(new_kv, path, rows.positions)
        seq.tokens.extend(int(t) for t in rows.tokens[path])

    def rollback(self, seq: Sequence, length: int) -> None:
        seq.cache.truncate(length)
        del seq.tokens[length:]

    def greedy(self, seq: Sequence, prompt: list[int], max_tokens: int,
               stop: set[int] = frozenset()) -> Iterator[int]:
        """Greedy continuation: yields each new token id; ends at a stop token or max_tokens."""
        logits = self.prefill(seq, prompt)
        for _ in range(max_tokens):
            token = int(np.argmax(logits))
            yield token
            if token in stop:
                return
            logits = self.decode(seq, token)
