"""Shortlist on the CPU: the output layer scored through a smaller copy with a proven error bound.

Owns: `OutputHead`, the output layer of a graph whose logits are one quantized matmul (Q8_0 or Q6_K
weights, the tied embedding included): `full(hidden)` computes every logit with the layer's own
generated kernel (the tape's, bit for bit), `shortlist(hidden_row, k)` computes exact logits only
for the rows that can be among the k best and proves the others cannot, `logits(hidden, top)` is
either for the engine; `StepTimes`, the hook a benchmark sets to time shortlist()'s steps (a no-op
otherwise); `eligible(graph)` and `cut_before_head(graph)` say which graphs have such a
layer and give the graph that stops before it. Does not own the copies and their constants
(shortlist_copy.py), how the scans share rows among threads (shortlist_scan.py), the row choice from
the copy's scores (shortlist_rows.py), which requests may use it (kinetic/runtime/shortlist.py),
whether a pass uses it or runs the full graph (kinetic/runtime/output_layer.py), nor the pass that
produces the hidden rows (the compiled step of the cut graph).

The bound (docs/shortlist.md has the proof): the copy and the original read the same quantized
activations x, so for a row w and its copy w', |S - A| = |(w - w').x| <= sum_b ||w_b - w'_b|| ||x_b||
<= ||w - w'|| ||x|| (Cauchy-Schwarz per 32-wide block, then over the blocks), and each kernel's float
result is within gamma_K times the sum of its parts' |w_i x_i| of its exact value. So |exact kernel
score - copy kernel score| <= sum_b c_rb ||x_b|| + 4 K 2^-149 <= c_r ||x|| + 4 K 2^-149, with c_rb and
c_r from shortlist_copy (rounded up) and the norms of x computed in f64 (inflated by SLACK): every row
is tested against c_r first, the few that pass against the block bound (Q6_K's Q4_K copy: c_r only).
The Q8_0 layer's copy is scored by shortlist_kernel_ir's lane kernel, Q6_K's by the Q4_K matmul;
every scan (the copy's, the full layer's, the exact rows') runs through shortlist_scan.scan_rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cache

import numpy as np

from kinetic.codegen.cpu.jit import default_jit
from kinetic.codegen.cpu.matmul import quantize_activations
from kinetic.codegen.cpu.shortlist_copy import COPIES, SLACK, CopyRows
from kinetic.codegen.cpu.shortlist_kernel_ir import BLOCK, render_scorer
from kinetic.codegen.cpu.shortlist_rows import best_rows, group_bounds, group_count, rows_reaching
from kinetic.codegen.cpu.shortlist_scan import NO_GROUPS, Groups, LaneInputs, lane_places, scan_rows
from kinetic.codegen.cpu.shortlist_store import load_or_make
from kinetic.codegen.cpu.step_kernels import StepKernels
from kinetic.codegen.cpu.target import host
from kinetic.ir.graph import Graph
from kinetic.ir.ops import Op

TINY = 2.0**-149  # the smallest f32 subnormal: the absolute error an underflowing product can add
MORE_FIRST = 7  # rows scored exactly beyond the k best-looking ones: the floor is the k-th best of k + 7
# exact scores, higher where the copy misranks (Gemma 3 greedy, 128 tokens: 12 % fewer rows pass it)


def eligible(graph: Graph) -> str | None:
    """The weight tensor of the graph's output layer when Shortlist can serve it (the logits are one
    q8 matmul of a Q8_0 weight, nothing after it: no scale or softcap), else None."""
    if "logits" not in dict(graph.outputs):  # an embedding model
        return None
    logits = graph.output("logits")
    if logits.op is not Op.MATMUL or getattr(logits.attrs, "activations", None) != "q8":
        return None
    weight = graph.node(logits.inputs[1])
    if weight.op is not Op.PARAM or weight.type.dtype not in COPIES:
        return None
    return weight.attrs.tensor


def cut_before_head(graph: Graph) -> Graph:
    """The graph whose output "hidden" is the output layer's input (f32 [R, K], the final norm's
    rows) in place of "logits"; node ids unchanged, the output matmul dropped."""
    logits = graph.output("logits")
    outputs = tuple(("hidden", logits.inputs[0]) if name == "logits" else (name, i) for name, i in graph.outputs)
    return Graph(tuple(n for n in graph.nodes if n.id != logits.id), outputs, graph.meta)


@dataclass
class CopyScores:
    """The copy's scores of one hidden row f32 [N], its ||x|| and ||x_b|| f64 [K/32] (rounded up by
    SLACK) and the scan's maxima per group of rows (shortlist_rows)."""

    scores: np.ndarray
    xnorm: float
    xblocks: np.ndarray
    groups: Groups


# OutputHead.shortlist's steps, in order, each timed up to where it ends (StepTimes)
STEPS = ("quant", "copy", "best", "exact_first", "floor", "reach", "exact_rest", "glue")


class StepTimes:
    """Process CPU time of each step of OutputHead.shortlist, summed over calls, and the exact rows
    each step scored (benchmarks/shortlist_exact.py sets one on a head; the steps are the real code's,
    marked where they end: quant, copy, best, exact_first, floor, reach, exact_rest, glue)."""

    def __init__(self):
        self.spent: dict[str, float] = dict.fromkeys(STEPS, 0.0)
        self.rows: dict[str, int] = dict.fromkeys(STEPS, 0)
        self._last = time.process_time()

    def start(self) -> None:
        self._last = time.process_time()

    def mark(self, step: str, rows: int = 0) -> None:
        """The time since the last mark (or start) is `step`'s."""
        now = time.process_time()
        self.spent[step] += now - self._last
        self.rows[step] += rows
        self._last = now


def _no_mark(step: str, rows: int = 0) -> None:
    """StepTimes.mark when no one is timing."""


@dataclass
class Shortlisted:
    """One hidden row's exact logits for every row that can be among the k best: ids i64, scores f32."""

    ids: np.ndarray
    scores: np.ndarray


class OutputHead:
    """The output layer of one graph on the CPU: its raw weight, its copy (made on first use) and the
    kernels. `logits(hidden, top)` is what the engine calls after a pass of the graph cut before it."""

    def __init__(self, raw: np.ndarray, dtype: str, k: int, *, threads: int, bound_scale: float = 1.0,
                 order: str = ""):
        self.raw = raw.view(np.ndarray)  # u8 [N, row bytes], the file's rows (memory-mapped; a plain view: np.memmap's
        # indexing costs about twice as much per gather)
        self.dtype = dtype
        self.kind = COPIES[dtype]  # the copy's type and the activations both kernels read
        self.k = k
        self.n = raw.shape[0]
        self.threads = max(1, threads)
        self.bound_scale = bound_scale  # tests break the bound with a scale below 1
        self.copy: CopyRows | None = None  # the copy and its bounds, loaded or made on first use
        self.c: np.ndarray | None = None  # f32 [N], each row's bound per unit of ||x|| (times bound_scale)
        self._group_c_of: np.ndarray | None = None  # the c whose group maxima _group_c_max holds
        self.per_block: np.ndarray = np.zeros((raw.shape[0], 0), np.float32)  # f32 [N, K/32] or [N, 0]
        self.tiny = 4.0 * k * TINY
        kernels = StepKernels()
        # addresses: scan_rows calls them; the exact one sums in the output matmul's order (its node's)
        self._exact = kernels.matmul(self.kind.original, k, order)
        if self.kind.copy is not None:
            self._approx = kernels.matmul(self.kind.copy, k)  # an address: scan_rows calls it
        else:
            self._lanes = lane_scorer(k // BLOCK, host().best_variant())
            self._places = lane_places(k // BLOCK)
        self.scored = 0  # rows scored exactly by shortlist(), summed over calls (the bench reports it)
        self.calls = 0
        self.step_times: StepTimes | None = None  # set by benchmarks/shortlist_exact.py: shortlist()'s parts

    def logits(self, hidden: np.ndarray, top: int) -> np.ndarray:
        """Logits f32 [R, N] for hidden rows f32 [R, K]: every one (top 0), or for each row the exact
        logits of every token that can be among its `top` best and -inf for the tokens proven not to
        (a row whose bound cannot be used gets every logit)."""
        if top <= 0 or len(hidden) == 0:
            return self.full(hidden)
        out = np.full((len(hidden), self.n), -np.inf, np.float32)
        for r in range(len(hidden)):
            if self.shortlist(hidden[r], top, out[r]) is None:
                out[r] = self.full(hidden[r:r + 1])[0]
        return out

    def prepare(self) -> None:
        """Load or make the copy now (the engine does, so no timed pass includes it)."""
        self._make_copy()

    def _run(self, kernel: int, weight: np.ndarray, acts, m: int, threads: int,
             out: np.ndarray | None = None, groups: Groups = NO_GROUPS) -> np.ndarray:
        """A matmul kernel (its address) over every row of weight for m activation rows: f32 [m, N]."""
        out = np.empty((m, weight.shape[0]), np.float32) if out is None else out
        extra = 0 if acts.extra is None else acts.extra.ctypes.data  # q8_k: the sums of 16
        args = (weight.ctypes.data, acts.q.ctypes.data, acts.d.ctypes.data, extra, out.ctypes.data, m)
        scan_rows(kernel, args, weight.shape[0], threads, keep=(weight, acts, out, groups), groups=groups)
        return out

    def full(self, hidden: np.ndarray) -> np.ndarray:
        """Every logit, f32 [R, N], by the layer's own kernel (what the full graph's tape computes)."""
        if len(hidden) == 0:
            return np.empty((0, self.n), np.float32)
        acts = quantize_activations(hidden, self.kind.activations)
        return self._run(self._exact, self.raw, acts, len(hidden), self.threads)

    def shortlist(self, hidden: np.ndarray, k: int, out: np.ndarray | None = None) -> Shortlisted | None:
        """Exact logits of every row that can be among the k best of one hidden row (f32 [K]); the rows
        left out are proven below k of those returned. Each is also written at its row in `out` (f32
        [N], for the engine: -inf elsewhere), where given. None when the bound cannot be used (a
        hidden value that is not finite)."""
        mark = self._marker()
        acts = quantize_activations(hidden[None, :], self.kind.activations)
        mark("quant")
        copy = self._approximate(acts)
        mark("copy")
        if not np.isfinite(copy.xnorm):
            return None
        out = np.full(self.n, -np.inf, np.float32) if out is None else out
        first = best_rows(copy.scores, max(1, min(k + MORE_FIRST, self.n)), copy.groups.keys)
        mark("best")
        self._exact_rows(acts, first, out)
        mark("exact_first", len(first))
        floor = float(np.sort(out[first])[-min(k, len(first))])
        mark("floor")
        if not np.isfinite(floor):
            return None
        rest = rows_reaching(copy.scores, self.c, copy.xnorm, floor, self.tiny, self.per_block, copy.xblocks,
                             copy.groups.keys, self._group_c(), np.sort(first))
        mark("reach")
        self._exact_rows(acts, rest, out)
        mark("exact_rest", len(rest))
        ids = np.concatenate([first, rest])
        self.scored += len(ids)
        self.calls += 1
        result = Shortlisted(ids, out[ids])
        mark("glue")
        return result

    def _marker(self):
        """StepTimes.mark, started now, where a benchmark times shortlist()'s steps; else a no-op."""
        if self.step_times is None:
            return _no_mark
        self.step_times.start()
        return self.step_times.mark

    def bounds(self, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For one hidden row f32 [K]: the copy's scores f32 [N] and each row's bound f64 [N], the most
        the layer's exact score can differ from the copy's (what shortlist() relies on: the block
        bound where the copy has one, else the row's)."""
        copy = self._approximate(quantize_activations(hidden[None, :], self.kind.activations))
        if self.per_block.shape[1]:
            margin = self.per_block.astype(np.float64) @ copy.xblocks
        else:
            margin = self.c.astype(np.float64) * copy.xnorm
        return copy.scores, (margin + self.tiny) * SLACK

    def _approximate(self, acts) -> CopyScores:
        """The copy's scores of one quantized row, with the row's norms and the groups' maxima."""
        self._make_copy()
        if self.kind.copy is None:
            lanes = LaneInputs(acts.q, acts.d, self._places)
            xnorm, xblocks = lanes.xnorm * SLACK, lanes.xblocks * SLACK
        else:
            x = acts.q.astype(np.float64).reshape(acts.d.size, -1) * acts.d.astype(np.float64).reshape(-1, 1)
            xblocks = np.sqrt(np.sum(x.reshape(-1, BLOCK) ** 2, axis=1)) * SLACK
            xnorm = float(np.sqrt(np.sum(x * x))) * SLACK
        scores = np.empty(self.n, np.float32)
        groups = Groups(scores, np.empty(group_count(self.n), np.int32))
        if self.kind.copy is None:
            self._score_lanes(acts, lanes, scores, groups)
        else:
            self._run(self._approx, self.copy.rows, acts, 1, self.threads, scores[None], groups)
        return CopyScores(scores, xnorm, xblocks, groups)

    def _score_lanes(self, acts, lanes: LaneInputs | None = None, out: np.ndarray | None = None,
                     groups: Groups = NO_GROUPS) -> np.ndarray:
        """The lane copy's scores f32 [N] of one q8_0 row (shortlist_kernel_ir's kernel, on every
        thread: shortlist_scan)."""
        lanes = lanes or LaneInputs(acts.q, acts.d, self._places)
        out = np.empty(self.n, np.float32) if out is None else out
        args = (self.copy.rows.ctypes.data, self.copy.scales.ctypes.data, lanes.xp.ctypes.data,
                lanes.xinit.ctypes.data, lanes.xd.ctypes.data, out.ctypes.data)
        scan_rows(self._lanes, args, self.n, self.threads, keep=(self.copy, lanes, out, groups), groups=groups)
        return out

    def _group_c(self) -> np.ndarray:
        """Each group's largest c (shortlist_rows.group_bounds), made again whenever c is replaced."""
        if self._group_c_of is not self.c:
            self._group_c_max, self._group_c_of = group_bounds(self.c), self.c
        return self._group_c_max

    def _make_copy(self) -> None:
        """The copy and its bounds, on first use: from the disk cache, else made (about 4 s for Gemma
        3's 262,144 rows) and stored there."""
        if self.copy is None:
            self.copy = load_or_make(self.raw, self.k, self.dtype)
            scale = np.float32(self.bound_scale)
            self.c = (np.asarray(self.copy.c) * scale).astype(np.float32)
            if self.copy.per_block is not None:
                self.per_block = (np.asarray(self.copy.per_block) * scale).astype(np.float32)

    def _exact_rows(self, acts, ids: np.ndarray, out: np.ndarray) -> None:
        """The exact kernel on some weight rows (i64 ids), each score written at its row of `out` (f32
        [N]): each row's float operations are the same sequence whatever rows share the call (matmul_ir),
        so each value is the full layer's. The rows are gathered first and scored in one call on this
        thread (one chunk or less): a call per row where it lies costs twice as much (Gemma 3, greedy)."""
        if len(ids):
            rows = np.take(self.raw, ids, axis=0)
            out[ids] = self._run(self._exact, rows, acts, 1, self.threads)[0]


@cache
def lane_scorer(n_blocks: int, variant: str) -> int:
    """The address of the compiled lane-copy scorer for rows of n_blocks blocks (VNNI where the host
    has it): kernel(codes, scales, xp, xinit, xd, out, n0, n1, n)."""
    ir, name = render_scorer(n_blocks, "vnni" if variant == "vnni" else "generic")
    return default_jit().address(ir, name)


def open_head(graph: Graph, weights, *, threads: int, bound_scale: float = 1.0) -> OutputHead | None:
    """The graph's output layer as an OutputHead, or None when Shortlist cannot serve it."""
    tensor = eligible(graph)
    if tensor is None:
        return None
    head = graph.output("logits")
    weight = graph.node(head.inputs[1])
    k = weight.type.shape[1]
    if k % COPIES[weight.type.dtype].block:
        return None
    return OutputHead(np.asarray(weights.tensor(tensor)), weight.type.dtype, k, threads=threads,
                      bound_scale=bound_scale, order=head.attrs.order)
