"""A model's prediction block (qwen35's MTP / nextn layer) as RAD-1's "mtp" drafter.

Owns: the trunk's hidden rows the engine hands out (`with_trunk_hidden` adds them to the graph the
runner runs, only for a graph whose meta names a prediction layer; `PredictionTrack` is where the
engine puts each sequence's committed rows), the block's own KV cache per sequence, and the drafter.

The block's maths (kinetic/frontend/mtp_block.py) pairs the token at position q with the trunk's
final-norm row of position q - 1 (llama.cpp's h_nextn; zeros where there is none: position 0, or a
prefix restored without passes) and predicts the token at q + 1. So with the sequence holding L
tokens and t the last generated one (position L, not in the cache yet):

    catch-up   one pass over the block rows q = (what its cache holds) .. L, each (x_q, h_{q-1}),
               committed to the block's cache: every such row is a fact of the sequence, not a guess
    draft      d1 = argmax of row L's logits; then row L + i is (d_i, the block's own output row of
               L + i - 1), one pass each, up to max_len (llama.cpp's speculative MTP chain)
    cut back   the block's cache returns to L + 1 entries: drafted rows leave no trace

A rollback or a new turn that changes earlier tokens cuts the block's cache back to the longest
prefix its tokens share with the sequence before the catch-up, so the cache never holds a row of
a path the sequence left. A draft is only a guess: nothing here can change the main model's answer.

The block runs on the model's device when that device can run its graph, else on the CPU (`block_device`):
the CPU runs its `concat` op and its `hidden.<width>` input through its interpreter with the compiled
matmuls (kinetic/codegen/cpu/executor.py); CUDA and Vulkan have a `concat` kernel and upload the
`hidden.<width>` rows with each pass's inputs (kinetic/codegen/{cuda,vulkan}/concat.py).
Does not own verification (kinetic/runtime/speculative.py) or the policy (kinetic/runtime/drafting.py).
"""

from __future__ import annotations

import weakref

import numpy as np

from kinetic import devices
from kinetic.codegen.runner import RunnerOptions
from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import Op
from kinetic.ir.rows import PassRows
from kinetic.ir.types import T, f32
from kinetic.runtime.drafting import Proposal
from kinetic.runtime.kv_cache import KVCache, SequenceCaches

CATCH_UP_ROWS = 128  # block rows per catch-up pass (a prompt's)
TRUNK_HIDDEN = "trunk_hidden"  # the runner's output: the final norm of every pass row, f32 [T, n_embd]


def has_prediction_block(graph: Graph) -> bool:
    return graph.get_meta("prediction_layer") is not None


def with_trunk_hidden(graph: Graph) -> Graph:
    """The graph with one more output, TRUNK_HIDDEN: the output norm (the head's own node's weight and
    attributes, reduction order included) of every row, not only the output rows. A norm is per row,
    so each row is bit for bit the head's normed row; a drafted pass's rows are their paths' rows."""
    logits = graph.output("logits")
    norm = graph.node(logits.inputs[0])
    take = graph.node(norm.inputs[0]) if norm.op is Op.RMS_NORM else None
    if take is None or take.op is not Op.TAKE_ROWS:
        raise ValueError("the graph's output layer is not rms_norm(take_rows(x)): no trunk hidden rows")
    x = take.inputs[0]
    node = Node(max(n.id for n in graph.nodes) + 1, Op.RMS_NORM, norm.attrs, (x, norm.inputs[1]),
                f32(T, graph.node(x).type.shape[1]))
    return Graph(graph.nodes + (node,), graph.outputs + ((TRUNK_HIDDEN, node.id),), graph.meta)


class PredictionTrack:
    """One sequence's side of the block: the trunk rows the engine committed since the drafter last
    read them (by position), the rows of a verify pass until keep(), and the block's own cache and
    tokens (created by the drafter on first use; they persist across the sequence's turns)."""

    MAX_BYTES = 32 << 20  # trunk rows kept unread (a sequence that never drafts): the oldest go first,
    # and the block reads zeros in their place (a guess less likely right, never a wrong answer)

    def __init__(self):
        self.rows: dict[int, np.ndarray] = {}  # position -> f32 [n_embd], committed, not yet read
        self.held: tuple[np.ndarray, np.ndarray] | None = None  # (positions, f32 [T, n_embd]) of verify()
        self.cache: KVCache | None = None  # the block's: entry q from (x_q, h_{q-1})
        self.tokens: list[int] = []  # x_q of each entry of `cache`
        self.last: np.ndarray | None = None  # the newest trunk row read (h_{q-1} of the next entry)

    def record(self, positions: np.ndarray, hidden: np.ndarray) -> None:
        """Committed rows (positions i32 [n], hidden f32 [n, n_embd]), in order."""
        for pos, row in zip(positions.tolist(), hidden, strict=True):
            self.rows.pop(pos, None)  # a position fed again (a rollback) moves to the newest
            self.rows[pos] = row.copy()
        while len(self.rows) * hidden.shape[1] * 4 > self.MAX_BYTES:
            del self.rows[next(iter(self.rows))]

    def hold(self, positions: np.ndarray, hidden: np.ndarray) -> None:
        self.held = (positions.copy(), hidden.copy())

    def keep(self, path: np.ndarray) -> None:
        """The rows of the last verify pass that were kept (Engine.keep's path)."""
        if self.held is not None:
            positions, hidden = self.held
            self.record(positions[path], hidden[path])
        self.held = None


_blocks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> its PredictionBlock


class PredictionBlock:
    """The block's graph on its runner, and what a pass of it gives: logits and its output rows."""

    def __init__(self, graph: Graph, weights, *, n_ctx: int, device: str, threads: int | None = None):
        from kinetic.numerics_mode import default_numerics
        from kinetic.passes import PassOptions, run_pipeline

        # the device's default numerics mode (a draft's orders change no answer)
        self.graph = run_pipeline(graph, PassOptions(numerics=default_numerics(device)))
        self.n_ctx = n_ctx
        self.device = block_device(device, self.graph)
        options = RunnerOptions(CATCH_UP_ROWS, threads, n_ctx, None)
        self.runner = devices.open_runner(self.device, self.graph, weights, options)
        self.kv_width = {n.attrs.layer: n.attrs.n_kv_head * n.attrs.head_dim
                         for n in self.graph.nodes if n.op is Op.STATE}
        self.n_embd = self.graph.output("hidden").type.shape[1]
        f32_cache = any(n.op is Op.ATTENTION and n.attrs.kv_dtype == "f32" for n in self.graph.nodes)
        self.kv_dtype = np.float32 if f32_cache else np.float16

    @classmethod
    def for_engine(cls, engine) -> PredictionBlock:
        """The block of the engine's model file (built once per engine, lowered as its graph was:
        the attention's cache type and the matmuls' activations)."""
        if engine not in _blocks:
            from kinetic.frontend.mtp_block import build_prediction_block

            options = _lowered_as(engine.graph)
            _blocks[engine] = cls(build_prediction_block(engine.weights.gguf, options), engine.weights,
                                  n_ctx=engine.n_ctx, device=engine.device,
                                  threads=getattr(engine.runner, "threads", None))
        return _blocks[engine]

    def new_cache(self) -> KVCache:
        return KVCache(self.kv_width, self.n_ctx, self.kv_dtype)

    def run(self, cache: KVCache, tokens: list[int], start: int, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One chain of rows (tokens at positions start.., hidden f32 [n, n_embd]) committed to `cache`:
        (logits f32 [n_vocab], output row f32 [n_embd]) of the last row."""
        rows = PassRows.chain(tokens, start)
        rows.hidden = np.ascontiguousarray(hidden, np.float32)
        result = self.runner.run(self.graph, rows, SequenceCaches({0: cache}))
        if self.runner.in_place:  # the runner wrote the rows at slots length + i (as Engine.forward)
            cache.commit_written(rows.positions)
        else:
            cache.commit(result.new_kv, np.arange(len(tokens)), rows.positions)
        return result.outputs["logits"][-1], result.outputs["hidden"][-1]


class MtpDrafter:
    """RAD-1's drafter from a model's prediction block, for one sequence (see the module docstring)."""

    name = "mtp"
    costly = True  # a pass of the block per guess: the policy asks for what it would draft (DraftPolicy.ask_len)

    def __init__(self, block: PredictionBlock, track: PredictionTrack):
        self.block = block
        self.track = track

    def propose(self, context: list[int], max_len: int) -> Proposal | None:
        if max_len < 1 or len(context) + max_len > self.block.n_ctx:
            return None
        logits, hidden = self.catch_up(context)
        committed = self.track.cache.length
        guesses = [int(np.argmax(logits))]
        while len(guesses) < max_len:
            logits, hidden = self.block.run(self.track.cache, guesses[-1:], len(context) + len(guesses) - 1,
                                            hidden[None])
            guesses.append(int(np.argmax(logits)))
        self.track.cache.truncate(committed)  # drafted rows leave no trace
        return Proposal(self.name, [guesses])

    def catch_up(self, context: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Commit the block rows for every position of `context` (its last token t included) that its
        cache does not hold; the last row's (logits, output row)."""
        track = self.track
        if track.cache is None:
            track.cache = self.block.new_cache()
        same = _shared_prefix(track.tokens, context)
        if same == len(context):  # t is always new: keep one row to run again
            same -= 1
        track.cache.truncate(same)
        del track.tokens[same:]
        hidden = np.zeros((len(context) - same, self.block.n_embd), np.float32)
        for i, q in enumerate(range(same, len(context))):
            row = track.rows.get(q - 1)
            if row is not None:
                hidden[i] = row
        for pos in [p for p in track.rows if p < len(context) - 2]:  # read: only h_{L-1} may be asked again
            del track.rows[pos]
        track.tokens.extend(context[same:])
        for lo in range(same, len(context), CATCH_UP_ROWS):  # a long prompt in chunks of bounded rows
            hi = min(lo + CATCH_UP_ROWS, len(context))
            out = self.block.run(track.cache, context[lo:hi], lo, hidden[lo - same:hi - same])
        return out


def _lowered_as(graph: Graph):
    """The lowering options a model's graph shows: its matmuls' activations and its cache type."""
    from kinetic.frontend.blocks import Options

    acts = {n.attrs.activations for n in graph.nodes if n.op is Op.MATMUL}
    kv = {n.attrs.kv_dtype for n in graph.nodes if n.op is Op.ATTENTION}
    return Options(activations=acts.pop() if len(acts) == 1 else "q8", kv_dtype=kv.pop() if len(kv) == 1 else "f16")


def block_device(device: str, graph: Graph) -> str:
    """The device the block runs on: the model's if it can run the block's graph, else the CPU (whose
    runner runs any graph: its compiled step, or its interpreter where the step has no kernel)."""
    return device if devices.device(device).unsupported(graph) is None else "cpu"


def _shared_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


def mtp_drafter(engine, seq) -> MtpDrafter | None:
    """The drafter of a sequence of an engine whose model has a prediction block, else None."""
    track = getattr(seq, "prediction", None)
    if track is None or not has_prediction_block(engine.graph):
        return None
    return MtpDrafter(PredictionBlock.for_engine(engine), track)
