"""The engine: runs passes of rows through a compiled graph and keeps sequence state.

Owns: forward passes over a batch of rows (tokens with sequence, position and parent), prompt
processing in chunks on a fixed grid (each chunk ends at a multiple of `batch` counted from position
0, the last at the prompt's end) run up to `prompt_pass` rows a pass (`prompt_passes`: consecutive
chunks together, a pass ending where a chunk does), written once as steps (`Engine.prompt_steps`: Engine.prefill and
Engine.feed run them alone, a generation yields them to Convoy), one-token decode, greedy selection
and rollback, and the shared pass of Convoy
(`run`: several sequences' rows, each given as a `SeqRows`, in one pass). It knows nothing about
text: it works on token ids (the tokenizer lives in the frontend). The passes run on a device's
runner (kinetic/codegen/runner.py), opened through the device registry (kinetic/devices.py). For a
model with a prediction block it also hands each sequence its kept rows' trunk hidden states
(`Sequence.prediction`, kinetic/runtime/mtp.py). Does not own which sequences share a pass
(kinetic/runtime/scheduler.py) nor, with Shortlist, whether a pass runs the full graph or the graph
cut before its output layer and the head (kinetic/runtime/output_layer.py).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from kinetic import devices
from kinetic.codegen.runner import Capabilities, Runner, RunnerOptions
from kinetic.ir.graph import Graph
from kinetic.ir.interpreter import WeightSource
from kinetic.ir.ops import Op
from kinetic.ir.rows import PassResult, PassRows
from kinetic.runtime.kv_cache import KVCache, SequenceCaches, check_cache_fits
from kinetic.runtime.mtp import TRUNK_HIDDEN, PredictionTrack, has_prediction_block, with_trunk_hidden
from kinetic.runtime.output_layer import OutputLayer
from kinetic.runtime.recurrent import part_states, recurrent_shapes, state_rows

if TYPE_CHECKING:
    from kinetic.codegen.cpu.matmul_choice import MatmulChoice

DEFAULT_CONTEXT = 4096
DEFAULT_BATCH = 128  # the grid: prompt chunks and warm states end at its multiples (Gemma-3 pp512 +3.5% over 64)
# Prompt rows one CPU pass takes at most: consecutive grid chunks run together up to this (a pass
# still ends at a grid point or the prompt's end). Measured, fast numerics, 2 threads, a 512-token
# prefill's process CPU time, medians alternating on one engine (load ~6): one 512-row pass instead
# of 4 of 128 is SmolLM2 Q4_1 0.54 -> 0.46 s, Gemma-3 270M 0.54 -> 0.46 s (-14..16%): each row split
# share's matmul tile gets 64 rows instead of 16 (a weight column decoded once a tile). The step's
# arenas grow 4x (SmolLM2 5.8 -> 22.8 MB f32, Gemma 10.3 -> 40.3 MB).
CPU_PROMPT_PASS = 512
T = TypeVar("T")


@dataclass
class Sequence:
    """One sequence's tokens and cache; tokens[:cache.length] are in the cache."""

    cache: KVCache
    tokens: list[int]
    pending: tuple | None = None  # the last verify() pass, (rows, new_kv, cache length), until keep()
    prediction: PredictionTrack | None = None  # a model with a prediction block: its trunk rows (runtime/mtp.py)
    prompt_pass: int | None = None  # prompt rows its next pass takes at most (None: Engine.prompt_pass; Convoy's bound)


@dataclass
class SeqRows:
    """One sequence's rows in the next pass, as a generation asks for them (kinetic/runtime/speculative.py
    yields these): `rows` numbers its sequence 0; `commit` True puts every row into the cache after
    the pass (a prompt chunk, a decode step), False holds them for keep() (a draft tree, as verify()).
    The pass fills `logits`, f32 [len(rows.output_rows), n_vocab]."""

    seq: Sequence
    rows: PassRows
    commit: bool = True
    logits: np.ndarray | None = None
    top: int = 0  # Shortlist (docs/shortlist.md): > 0, only logits that can be among the `top` best are exact


class Engine:
    def __init__(self, graph: Graph, weights: WeightSource, *, n_ctx: int = DEFAULT_CONTEXT,
                 batch: int = DEFAULT_BATCH, device: str = "cpu", threads: int | None = None,
                 gpu_layers: int | None = None, shortlist: bool = True, matmul: MatmulChoice | None = None,
                 prompt_pass: int | None = None):
        """`batch` is the grid (prompt chunks and warm states end at its multiples); `prompt_pass` the
        prompt rows a pass takes at most, a run of whole grid chunks (None, or a model or device whose
        passes do not merge: `default_prompt_pass`)."""
        self.graph = graph
        self.n_ctx = n_ctx
        self.batch = batch
        self.device = device
        self.weights = weights
        self.recurrent_shapes = recurrent_shapes(graph)  # recurrent state name -> (rows, width)
        declared = devices.DEVICES[device].capabilities if device in devices.DEVICES else None
        # None: a device without a capability record (the reference interpreter) runs any PassRows
        self.capabilities: Capabilities | None = declared() if declared else None
        # an asked pass size holds where passes may merge: not for a recurrent model (states checkpointed
        # per commit) nor on a device with a row limit, which keep one chunk a pass (default_prompt_pass)
        mergeable = not self.recurrent_shapes and self.max_rows is None
        asked = prompt_pass if prompt_pass is not None and mergeable else None
        self.prompt_pass = max(batch, asked if asked is not None else self.default_prompt_pass())
        # a prediction block drafts from the trunk's hidden rows: the run graph hands them out (runtime/mtp.py)
        self.prediction = has_prediction_block(graph)
        run_source = with_trunk_hidden(graph) if self.prediction else graph
        # Shortlist (docs/shortlist.md; False is --off shortlist): the runner runs the graph cut before
        # its output layer and self.head scores that layer, in full or only the rows that can win; or
        # self.output runs a pass through the full graph instead, whichever is faster (runtime/output_layer.py)
        self.head, self._run_graph = (_shortlist_head(run_source, weights, device, threads) if shortlist
                                      else (None, run_source))
        options = RunnerOptions(self.prompt_pass, threads, n_ctx, gpu_layers, matmul=matmul)
        self.runner: Runner = devices.open_runner(device, self._run_graph, weights, options)
        self.output = (OutputLayer(self.head, self.runner, self._run_graph, run_source,
                                   lambda: devices.open_runner(device, run_source, weights, options))
                       if self.head is not None else None)
        self.kv_width: dict[int, int] = {}
        self.kv_dtype = np.float16
        for node in graph.nodes:
            if node.op is Op.STATE:
                self.kv_width[node.attrs.layer] = node.attrs.n_kv_head * node.attrs.head_dim
            if node.op is Op.ATTENTION and node.attrs.kv_dtype == "f32":
                self.kv_dtype = np.float32
        self.n_vocab = graph.output("logits").type.shape[1]
        self.passes = 0  # forward passes run (prompt chunks, decode steps, verification passes)

    def default_prompt_pass(self) -> int:
        """CPU_PROMPT_PASS on the CPU; the grid (one chunk a pass) elsewhere, for a recurrent model
        (its states are checkpointed per commit, kinetic/runtime/recurrent.py) and on a device with
        a row limit."""
        merged = self.device == "cpu" and not self.recurrent_shapes and self.max_rows is None
        return CPU_PROMPT_PASS if merged else self.batch

    def next_pass(self, seq: Sequence, n: int) -> int:
        """Tokens the next prompt pass of `seq` takes of the n it has still to read: whole grid chunks
        up to its prompt rows (Sequence.prompt_pass, else the engine's), the first chunk always."""
        start = seq.cache.length
        return next(prompt_passes(start, n, self.batch, seq.prompt_pass or self.prompt_pass))[1] - start

    @property
    def max_sequences(self) -> int | None:
        """Sequences one pass may hold (None: any number)."""
        return self.capabilities.max_sequences if self.capabilities else None

    @property
    def max_rows(self) -> int | None:
        """Rows one pass may hold (None: any number)."""
        return self.capabilities.max_rows if self.capabilities else None

    @property
    def in_place(self) -> bool:
        """The runner writes a pass's keys and values into the caches itself (commit by length)."""
        return self.runner.in_place

    def close(self) -> None:
        """Free what the runner holds on its device; the engine runs no pass after this."""
        self.runner.close()
        if self.output is not None:
            self.output.close()

    def new_sequence(self) -> Sequence:
        check_cache_fits(self.n_ctx, sum(self.kv_width.values()), np.dtype(self.kv_dtype).itemsize)
        return Sequence(KVCache(self.kv_width, self.n_ctx, self.kv_dtype, recurrent=self.recurrent_shapes), [],
                        prediction=PredictionTrack() if self.prediction else None)

    def forward(self, rows: PassRows, seqs: dict[int, Sequence], commit: bool = True, top: int = 0) -> np.ndarray:
        """One pass: logits f32 [R, n_vocab] for rows.output_rows; commits every row unless told not to.
        `top` > 0: only the logits that can be among each row's `top` best are exact (SeqRows.top)."""
        if commit and rows.chain_seq >= 0:
            seqs[rows.chain_seq].cache.check_room(len(rows.tokens))
        elif commit:
            for sid, s in seqs.items():
                s.cache.check_room(int(np.count_nonzero(rows.seqs == sid)))
        caches = SequenceCaches({sid: s.cache for sid, s in seqs.items()})
        if commit and self.recurrent_shapes:  # the runner returns only the states a commit keeps
            rows = state_rows(rows)
        result, logits = self._pass(rows, caches, [(len(rows.output_rows), top)])
        if commit and rows.chain_seq >= 0 and self.in_place:  # one sequence's chain: every row is its own
            s = seqs[rows.chain_seq]
            s.cache.commit_written(rows.positions)
            s.cache.recurrent.commit(result.new_state, np.arange(len(rows.tokens)))
            s.tokens.extend(rows.tokens.tolist())
            _record_hidden(s, result.outputs, rows, np.arange(len(rows.tokens)))
        elif commit:
            for sid, s in seqs.items():
                self._commit(s, rows, np.flatnonzero(rows.seqs == sid), result.new_kv, result.new_state,
                             result.outputs)
        return logits

    def _pass(self, rows: PassRows, caches: SequenceCaches,
              tops: list[tuple[int, int]]) -> tuple[PassResult, np.ndarray]:
        """One runner pass and its logits, f32 [len(rows.output_rows), n_vocab]: the graph's, or with
        Shortlist the faster of the full graph and the cut graph with its head (runtime/output_layer.py).
        `tops`: each part's (output rows, Shortlist top), in output row order."""
        self.passes += 1
        if self.output is not None:
            return self.output.run(rows, caches, tops)
        result = self.runner.run(self._run_graph, rows, caches)
        return result, result.outputs["logits"]

    def _commit(self, seq: Sequence, rows: PassRows, mine: np.ndarray, new_kv: dict, new_state: dict,
                outputs: dict) -> None:
        """Append pass rows `mine` (one sequence's, in order) to its cache, recurrent state and tokens."""
        if self.in_place:
            seq.cache.commit_written(rows.positions[mine])
        else:
            seq.cache.commit(new_kv, mine, rows.positions)
        seq.cache.recurrent.commit(new_state, mine)
        seq.tokens.extend(int(t) for t in rows.tokens[mine])
        _record_hidden(seq, outputs, rows, mine)

    def run(self, parts: list[SeqRows]) -> None:
        """One pass of several sequences' rows (one part per sequence, at most max_sequences): fills
        each part's logits, commits the parts that commit and holds the others for keep(). Batch
        invariance makes each part's logits the ones it gets in a pass of its own."""
        if len(parts) == 1:  # the usual pass keeps the one-sequence paths (a chain's short tables)
            part = parts[0]
            part.logits = (self.forward(part.rows, {0: part.seq}, top=part.top) if part.commit
                           else self.verify(part.seq, part.rows, top=part.top))
            return
        if self.max_sequences is not None and len(parts) > self.max_sequences:
            raise ValueError(f"{len(parts)} sequences in one pass; the device runs {self.max_sequences}")
        if len({id(p.seq) for p in parts}) != len(parts):
            raise ValueError("a sequence can have only one part in a pass")
        for part in parts:
            part.seq.cache.check_room(len(part.rows.tokens))
        rows = _merged([p.rows for p in parts])
        if self.recurrent_shapes:  # a committing part keeps its last row's state, a held one every row's
            rows = state_rows(rows, held={i for i, p in enumerate(parts) if not p.commit})
        # logits f32 [sum of the parts' outputs, n_vocab], in part order
        result, logits = self._pass(rows, SequenceCaches({i: p.seq.cache for i, p in enumerate(parts)}),
                                    [(len(p.rows.output_rows), p.top) for p in parts])
        first_row = first_out = 0
        for part in parts:
            mine = np.arange(first_row, first_row + len(part.rows.tokens))
            n_out = len(part.rows.output_rows)
            part.logits = logits[first_out:first_out + n_out]
            if part.commit:
                self._commit(part.seq, rows, mine, result.new_kv, result.new_state, result.outputs)
            else:  # as verify(): keep() commits the accepted path
                new_kv = {layer: (k[mine], v[mine]) for layer, (k, v) in result.new_kv.items()}
                part.seq.pending = (part.rows, new_kv, part.seq.cache.length)
                part.seq.cache.recurrent.hold(part_states(result.new_state, mine))
                _hold_hidden(part.seq, result.outputs, rows, mine)
            first_row, first_out = first_row + len(mine), first_out + n_out

    def prompt_steps(self, seq: Sequence, tokens: list[int], *, logits: bool = True,
                     top: int = 0) -> Generator[SeqRows, None, np.ndarray | None]:
        """Feeding `tokens` after what `seq` holds, as steps: yields each prompt pass's rows (whole grid
        chunks, next_pass, asked again before each pass: Convoy may change the sequence's prompt_pass
        in between), which the driver runs (Engine.run) before resuming. With `logits`, the last pass's
        last row gives logits and the steps return them, f32 [n_vocab] (`top` > 0: Shortlist's, exact
        for the tokens that can be among the `top` best, SeqRows.top); without, no pass runs the
        output layer and they return None. Engine.prefill and Engine.feed run these alone."""
        if logits and not tokens:
            raise ValueError("prefill needs at least one token")
        done = 0
        while done < len(tokens):
            n = self.next_pass(seq, len(tokens) - done)
            done += n
            last = logits and done == len(tokens)
            want = SeqRows(seq, PassRows.chain(tokens[done - n:done], seq.cache.length,
                                               outputs="last" if last else "none"), top=top if last else 0)
            yield want
        return want.logits[-1] if logits else None

    def prefill(self, seq: Sequence, tokens: list[int], top: int = 0) -> np.ndarray:
        """Feed tokens after what the sequence holds, in its prompt passes (prompt_steps, run alone);
        logits of the last token, f32 [n_vocab] (`top` > 0: Shortlist's, SeqRows.top)."""
        return self._run_alone(self.prompt_steps(seq, tokens, top=top))

    def feed(self, seq: Sequence, tokens: list[int]) -> None:
        """Feed tokens in its prompt passes without computing logits (the output layer is skipped):
        a rollback's refeed, or a prompt whose passes a caller interleaves with checks."""
        self._run_alone(self.prompt_steps(seq, tokens, logits=False))

    def _run_alone(self, steps: Generator[SeqRows, None, T]) -> T:
        """Runs each pass the steps ask for on its own (Engine.run); what the steps return."""
        while True:
            try:
                part = next(steps)
            except StopIteration as end:
                return end.value
            self.run([part])

    def decode(self, seq: Sequence, token: int, top: int = 0) -> np.ndarray:
        return self.prefill(seq, [token], top)

    def verify(self, seq: Sequence, rows: PassRows, top: int = 0) -> np.ndarray:
        """One pass of a draft tree of one sequence (rows.seqs all 0, parents before children) that
        commits nothing: logits f32 [T, n_vocab] for rows.output_rows (all rows, for verification).
        keep() then commits the accepted path; the compiled step has already written every row in
        place at slot length + i."""
        seq.cache.check_room(len(rows.tokens))
        result, logits = self._pass(rows, SequenceCaches({0: seq.cache}), [(len(rows.output_rows), top)])
        seq.pending = (rows, result.new_kv, seq.cache.length)
        seq.cache.recurrent.hold(result.new_state)  # each row's state along its path, until keep()
        _hold_hidden(seq, result.outputs, rows, np.arange(len(rows.tokens)))
        return logits

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
        seq.cache.recurrent.keep(path)  # the state after the path's last row
        if seq.prediction is not None:
            seq.prediction.keep(path)
        seq.tokens.extend(int(t) for t in rows.tokens[path])

    def rollback(self, seq: Sequence, length: int) -> None:
        """Cut the sequence back to its first `length` tokens. A recurrent state cannot be cut back:
        it restarts from its latest checkpoint at or before `length` and the tokens from there are
        fed again (kinetic/runtime/recurrent.py), giving bit for bit the state it had there."""
        if not 0 <= length <= len(seq.tokens):
            raise ValueError(f"cannot roll back to {length}: the sequence holds {len(seq.tokens)}")
        start = seq.cache.recurrent.rewind(length)
        refeed = seq.tokens[start:length]
        seq.cache.truncate(start)
        del seq.tokens[start:]
        self.feed(seq, refeed)

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


def prompt_passes(start: int, n: int, batch: int, pass_rows: int) -> Iterator[tuple[int, int]]:
    """The passes (from, to) of n tokens fed after `start` cache entries, lazily: runs of consecutive
    grid chunks of at most `pass_rows` rows, a chunk alone where it is longer. The grid: each chunk
    ends at a multiple of `batch` counted from position 0, the last at start + n, so a prompt is cut
    the same way whether it starts at 0 or resumes from a state stored at a grid point (warm.py); with
    pass_rows = batch the passes are the chunks. Every pass ends where a chunk does, so the grid's
    points (warm states) are the same whatever `pass_rows`.
    A pass from `start` takes as many chunks as fit: the chunk ends are `end` = start + n and the grid
    points k * batch inside (start, end), so it ends at `end` if end - start <= pass_rows, else at the
    last grid point <= start + pass_rows, or at the first chunk's end when that is further."""
    end = start + n
    while start < end:
        first = min(end, (start // batch + 1) * batch)  # the first chunk's end
        furthest = end if end - start <= pass_rows else (start + pass_rows) // batch * batch
        stop = max(first, furthest)
        yield start, stop
        start = stop


def _record_hidden(seq: Sequence, outputs: dict, rows: PassRows, mine: np.ndarray) -> None:
    """A sequence's committed pass rows `mine`: their trunk rows to its prediction track, if it has one."""
    if seq.prediction is not None and TRUNK_HIDDEN in outputs:
        seq.prediction.record(rows.positions[mine], outputs[TRUNK_HIDDEN][mine])


def _hold_hidden(seq: Sequence, outputs: dict, rows: PassRows, mine: np.ndarray) -> None:
    """A verify pass's rows `mine` (one sequence's): their trunk rows until keep() names the kept ones."""
    if seq.prediction is not None and TRUNK_HIDDEN in outputs:
        seq.prediction.hold(rows.positions[mine], outputs[TRUNK_HIDDEN][mine])


def _merged(tables: list[PassRows]) -> PassRows:
    """One pass's row table from several sequences' own tables (each numbering its sequence 0):
    table i's rows become sequence i's, in order, with parents and output rows shifted."""
    offsets = np.cumsum([0] + [len(t.tokens) for t in tables[:-1]])
    return PassRows(
        tokens=np.concatenate([t.tokens for t in tables]).astype(np.int32),
        positions=np.concatenate([t.positions for t in tables]).astype(np.int32),
        seqs=np.concatenate([np.full(len(t.tokens), i, np.int32) for i, t in enumerate(tables)]),
        parents=np.concatenate([np.where(t.parents >= 0, t.parents + o, -1)
                                for t, o in zip(tables, offsets, strict=True)]).astype(np.int32),
        output_rows=np.concatenate([t.output_rows + o for t, o in zip(tables, offsets, strict=True)]).astype(np.int32),
    )


def _shortlist_head(graph: Graph, weights: WeightSource, device: str, threads: int | None):
    """(Shortlist's output head, the graph the runner runs): on the CPU, for an output layer it can
    serve (kinetic/codegen/cpu/shortlist.py), the head and the graph cut before that layer; else
    (None, graph)."""
    if device != "cpu":
        return None, graph
    from kinetic.codegen.cpu import shortlist
    from kinetic.codegen.cpu.step_threads import available_cpus

    head = shortlist.open_head(graph, weights, threads=threads or available_cpus())
    return (head, shortlist.cut_before_head(graph)) if head is not None else (None, graph)
