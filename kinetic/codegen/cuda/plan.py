"""One pass shape's work on the CUDA runtime: its launches in graph order, its buffers, and the
staging buffer of everything that changes between passes of that shape.

Owns: `LaunchOrder` (once per model: where each launch runs in the graph's order, and when each
value is read for the last time) and `Plan` (built once per (rows T, output rows R): one launch per
node that has kernels, in graph order, buffers reused once a value is dead, the GEMV for one row and
the GEMM for more; per pass, filling the staging buffer and reading the outputs and the new keys
and values back). The fused
launches are read from the graph the device phase made: an add_rms_norm launches where its add
stands and writes both values, a rope_pair writes its other rotation too, a producer that an
in-producer quantize reads writes the quantized row that quantize node stands for, and every matmul
reads its quantize node's row. Does not own the device calls (backends.py), the kernels
(renderer.py and the kernel modules), the per-pass tables it stages (rotary cos/sin and visibility
masks: kinetic/codegen/common/tables.py) or the model-level state: weights, the sequences' caches,
recordings (model.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kinetic.codegen.common.tables import pass_mask
from kinetic.codegen.cuda.backends import ALIGN
from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import Op
from kinetic.ir.rows import PassRows, SequenceKV
from kinetic.passes.device_fusion import computed_by, quantized_in_producer

F32 = np.float32
# attention_rows (8 warps per (row, head), the keys' scores and factors in parallel) for every pass
# whose scratch of factors, rows x heads x 2 x n_ctx floats, stays within this; the one-warp kernel
# (no scratch) beyond, where many rows keep the GPU busy anyway
ATTENTION_SCRATCH_BYTES = 64 << 20


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a plan; `args` hold device views and numbers, and ("k"|"v", layer) for
    the sequence's cache, filled in when the plan is recorded for a sequence."""

    kernel: str
    rows: int
    args: tuple


@dataclass(frozen=True)
class LaunchOrder:
    """What every plan of a graph shares, whatever its shape: per position in the graph's order, the
    node whose launch runs there (None: none) and the values read there for the last time; and
    which producers' launches write a quantize node's row (device_fusion.quantized_in_producer)."""

    launches: tuple[Node | None, ...]
    dead_after: tuple[tuple[int, ...], ...]
    quantized_by: dict[int, Node]

    @staticmethod
    def of(graph: Graph, kernels: dict[int, list], skip: frozenset[int]) -> LaunchOrder:
        """A node launches where it stands, but an add_rms_norm launches where its add stands (its
        other input is a weight) and a value another launch computes has no launch of its own."""
        absorbed = computed_by(graph)  # an add -> its add_rms_norm, a rotation -> its pair
        hoisted = {n.inputs[0]: n for n in graph.nodes if n.op is Op.ADD_RMS_NORM}

        def launch_at(node: Node) -> Node | None:
            if node.id in hoisted:
                return hoisted[node.id]
            if node.op is Op.ADD_RMS_NORM or node.id in absorbed or node.id in skip:
                return None
            return node if kernels.get(node.id) else None

        launches = tuple(launch_at(node) for node in graph.nodes)
        # per position, the values read there: the node's inputs, and those of the launch running there
        reads_at = [set(node.inputs) | set(_launch_reads(graph, launch) if launch else ())
                    for node, launch in zip(graph.nodes, launches, strict=True)]
        last_use = {j: i for i, reads in enumerate(reads_at) for j in reads}
        dead_after = tuple(tuple(j for j in reads if last_use[j] == i) for i, reads in enumerate(reads_at))
        return LaunchOrder(launches, dead_after, quantized_in_producer(graph))


def _launch_reads(graph: Graph, node: Node) -> tuple[int, ...]:
    """The values a node's launch reads: its inputs, and those of the values it computes too."""
    if node.op is Op.ADD_RMS_NORM:
        return graph.node(node.inputs[0]).inputs + node.inputs[1:]
    if node.op is Op.ROPE_PAIR:
        return node.inputs[:2] + graph.node(node.inputs[2]).inputs
    return node.inputs


class Plan:
    """The launches and buffers of one pass shape: n_rows rows (T), n_out output rows (R)."""

    def __init__(self, model, n_rows: int, n_out: int):
        self.model, self.n_rows, self.n_out = model, n_rows, n_out
        graph, backend = model.graph, model.backend
        self.counts = {"T": n_rows, "R": n_out}
        self._layout_inputs()
        self.inputs = backend.empty(self.input_bytes)
        self.staging = backend.host_empty(self.input_bytes)
        # the keys' and values' f32 rows of every layer side by side, read back in one copy
        self.kv_nodes: dict[int, tuple[int, int, int]] = {}  # layer -> k node, v node, width
        for layer, node in model.kv_layers.items():
            self.kv_nodes[layer] = (node.inputs[1], node.inputs[2], node.attrs.n_kv_head * node.attrs.head_dim)
        kv_widths = [w for _, _, w in self.kv_nodes.values()]
        self.kv_bytes = 2 * n_rows * sum(kv_widths) * 4
        self.kv_rows = backend.empty(self.kv_bytes)
        self.buffers: dict[int, object] = {}
        self.launches: list[Launch] = []
        self._scratch = None
        self._build(graph, backend)

    # -- layout of what changes per pass
    def _layout_inputs(self) -> None:
        graph, t = self.model.graph, self.n_rows
        fields = [("tokens", 4 * t), ("output_rows", 4 * max(self.n_out, 1)), ("meta", 8)]
        split = self.model.split
        if split:
            fields.append(("hidden", 4 * t * int(graph.node(split.boundary).type.shape[-1])))
        mine = [n for n in graph.nodes if n.id not in self.model.skip]
        self.rope_keys = sorted({(n.attrs.n_rot, float(n.attrs.theta), float(n.attrs.freq_scale))
                                 for n in mine if n.op in (Op.ROPE, Op.ROPE_PAIR)})
        for key in self.rope_keys:
            fields += [(("cos", key), 4 * t * (key[0] // 2)), (("sin", key), 4 * t * (key[0] // 2))]
        self.windows = sorted({n.attrs.window for n in mine if n.op is Op.ATTENTION})
        fields += [(("mask", w), t * self.model.n_ctx) for w in self.windows]
        self.offsets: dict[object, tuple[int, int]] = {}
        at = 0
        for name, nbytes in fields:
            self.offsets[name] = (at, nbytes)
            at += -(-nbytes // ALIGN) * ALIGN
        self.input_bytes = at

    def input_view(self, name):
        at, nbytes = self.offsets[name]
        return self.inputs[at : at + max(nbytes, 4)]

    def staged(self, name, dtype) -> np.ndarray:
        at, nbytes = self.offsets[name]
        return self.staging[at : at + nbytes].view(dtype)

    # -- the launches, with buffers reused once their value is dead
    def _build(self, graph: Graph, backend) -> None:
        order, split = self.model.order, self.model.split
        self.quantized_by = order.quantized_by
        pinned = {nid for _, nid in graph.outputs} | ({split.boundary} if split else set())
        self.kv_at, at = {}, 0
        for _layer, (k_node, v_node, width) in sorted(self.kv_nodes.items()):
            for nid in (k_node, v_node):
                self.kv_at[nid] = self.kv_rows[at : at + self.n_rows * width * 4]
                at += self.n_rows * width * 4
        self.rows_of: dict[int, tuple] = {}  # quantize node id -> its row's buffers (xq, xd[, xs])
        free: dict[int, list] = {}  # bytes -> buffers of that size no live value holds

        def take(nbytes: int):
            nbytes = max(-(-nbytes // ALIGN) * ALIGN, ALIGN)
            pool = free.get(nbytes)
            return pool.pop() if pool else backend.empty(nbytes)

        self._take = take
        for i, node in enumerate(graph.nodes):
            if split and node.id == split.boundary:
                self.buffers[node.id] = self.input_view("hidden")
            elif node.op is Op.INPUT:
                name = node.attrs.name
                self.buffers[node.id] = self.input_view(name) if name in ("tokens", "output_rows") else None
            elif order.launches[i] is not None:
                self._launches(order.launches[i])
            for j in order.dead_after[i]:  # values read for the last time: their buffers serve again
                if j not in pinned and j not in self.kv_at:
                    for buf in (self.buffers.pop(j, None), *self.rows_of.pop(j, ())):
                        if buf is not None and graph.node(j).op is not Op.INPUT:
                            free.setdefault(buf.nbytes, []).append(buf)

    def _output(self, node: Node):
        """A new buffer for a node's value (its slot of the keys' and values' rows for an attention's k, v)."""
        if node.id in self.kv_at:
            buf = self.kv_at[node.id]
        else:
            buf = self._take(self.count(node) * int(node.type.shape[-1]) * 4)
        self.buffers[node.id] = buf
        return buf

    def _quantized_row(self, producer: Node) -> tuple:
        """The buffers of the quantized row a producer's launch also writes (for the in-producer
        quantize node that reads it), or () when it writes none."""
        q = self.quantized_by.get(producer.id)
        return () if q is None or not self.count(q) else self._row_buffers(q)

    def _row_buffers(self, q: Node) -> tuple:
        """A quantize node's row: int8 values, f32 scales (and Q8_1's f32 sums), as quantize.py writes."""
        n, k, fmt = self.count(q), int(q.type.shape[-1]), q.attrs.format
        block = 256 if fmt == "q8_k" else 32
        sums = (self._take(n * (k // 32) * 4),) if fmt == "q8_1" else ()
        acts = (self._take(n * k), self._take(n * (k // block) * 4), *sums)
        self.rows_of[q.id] = acts
        return acts

    def attention_scratch(self, heads: int):
        """attention_rows' scratch f32 [rows, heads, 2, n_ctx], one for every layer of the pass (their
        launches run one after another)."""
        nbytes = heads * 2 * self.model.n_ctx * 4
        if self._scratch is None or self._scratch.nbytes < nbytes:
            self._scratch = self.model.backend.empty(nbytes)
        return self._scratch

    def count(self, node: Node) -> int:
        return self.counts[node.type.shape[0]]

    def _rope_tables(self, a) -> tuple:
        key = (a.n_rot, float(a.theta), float(a.freq_scale))
        return self.input_view(("cos", key)), self.input_view(("sin", key))

    def _fused_launch(self, node: Node, n: int) -> None:
        """The launch of a device form: an add and the norm of its sum, two rotations, a quantizer."""
        model, graph, add = self.model, self.model.graph, self.launches.append
        kernel = model._kernels[node.id][0].name
        if node.op is Op.ADD_RMS_NORM:  # the add of input 0 and the norm of its sum
            total = graph.node(node.inputs[0])
            summed, out = self._output(total), self._output(node)
            weight = (model.weights[graph.node(node.inputs[1]).attrs.tensor],) if len(node.inputs) == 2 else ()
            row = self._quantized_row(node)
            if n:
                add(Launch(kernel, n, (*(self.buffers[j] for j in total.inputs), *weight, summed, out, *row)))
        elif node.op is Op.ROPE_PAIR:  # the other rotation (input 2) and this one
            other = graph.node(node.inputs[2])
            early, out = self._output(other), self._output(node)
            if n:
                add(Launch(kernel, n, (self.buffers[other.inputs[0]], self.buffers[node.inputs[0]],
                                       *self._rope_tables(node.attrs), early, out)))
        elif n:  # a quantize node no producer writes: the quantizer
            add(Launch(kernel, n, (self.buffers[node.inputs[0]], *self._row_buffers(node))))

    def _launches(self, node: Node) -> None:
        """The launches of one node's kernels (and the buffers of every value they write)."""
        model, graph, add = self.model, self.model.graph, self.launches.append
        kernels = model._kernels[node.id]
        n = self.count(node)
        if node.op in (Op.ADD_RMS_NORM, Op.ROPE_PAIR, Op.QUANTIZE):
            self._fused_launch(node, n)
            return
        ins = [self.buffers.get(j) for j in node.inputs]
        op, a = node.op, node.attrs
        out = self._output(node)
        if not n:  # no rows of this value in this pass shape (no output rows): nothing to launch
            return
        if op is Op.EMBED:
            add(Launch(kernels[0].name, n, (model.weights[graph.node(node.inputs[0]).attrs.tensor], ins[1], out)))
        elif op is Op.MATMUL:
            one_row, tiled = kernels
            weight = model.weights[graph.node(node.inputs[1]).attrs.tensor]
            row = self.rows_of[node.inputs[0]]
            if n == 1:
                add(Launch(one_row.name, n, (weight, *row, out)))
            else:  # each weight block read once per tile of rows; every row's result the GEMV's
                add(Launch(tiled.name, n, (weight, *row, out, n)))
        elif op is Op.RMS_NORM:
            weight = (model.weights[graph.node(node.inputs[1]).attrs.tensor],) if len(ins) == 2 else ()
            add(Launch(kernels[0].name, n, (ins[0], *weight, out, *self._quantized_row(node))))
        elif op is Op.ROPE:
            add(Launch(kernels[0].name, n, (ins[0], *self._rope_tables(a), out)))
        elif op is Op.ATTENTION:
            store, one_warp, parallel = kernels[:3]
            layer = graph.node(node.inputs[3]).attrs.layer
            meta = self.input_view("meta")
            add(Launch(store.name, n, (ins[1], ins[2], meta, ("k", layer), ("v", layer))))
            cache = (ins[0], ("k", layer), ("v", layer), self.input_view(("mask", a.window)), meta)
            row = self._quantized_row(node)
            if n * a.n_head * 2 * model.n_ctx * 4 <= model.attention_scratch_bytes:
                add(Launch(parallel.name, n, (*cache, self.attention_scratch(n * a.n_head), out, *row)))
            else:  # the one-warp kernel writes no quantized row: the quantizer after it does
                add(Launch(one_warp.name, n, (*cache, out)))
                if row:
                    add(Launch(kernels[3].name, n, (out, *row)))
        elif op is Op.TAKE_ROWS:
            add(Launch(kernels[0].name, n, (ins[0], ins[1], out)))
        elif op is Op.ADD_BIAS:
            add(Launch(kernels[0].name, n, (ins[0], model.weights[graph.node(node.inputs[1]).attrs.tensor], out)))
        else:
            table = (model.gelu,) if op in (Op.GELU, Op.GEGLU) else ()
            add(Launch(kernels[0].name, n, (*ins, *table, out, *self._quantized_row(node))))

    # -- per pass
    def fill(self, rows: PassRows, cache: SequenceKV, hidden: np.ndarray | None = None) -> None:
        """Write what this pass's launches read into the host staging buffer."""
        t, n_c = self.n_rows, cache.length
        if hidden is not None:
            self.staged("hidden", F32)[:] = np.ascontiguousarray(hidden, F32).reshape(-1)
        self.staged("tokens", np.int32)[:] = rows.tokens
        if self.n_out:
            self.staged("output_rows", np.int32)[:] = rows.output_rows
        self.staged("meta", np.int32)[:] = (n_c + t, n_c)
        for key in self.rope_keys:
            cos, sin = self.model.rope_tables(key).rows(np.asarray(rows.positions))
            self.staged(("cos", key), F32)[:] = cos.reshape(-1)
            self.staged(("sin", key), F32)[:] = sin.reshape(-1)
        cpos = cache.positions[:n_c]
        for w in self.windows:
            mask = self.staged(("mask", w), np.uint8).reshape(t, self.model.n_ctx)
            mask[:, : n_c + t] = pass_mask(rows, cpos, w)

    def read(self, node: Node) -> np.ndarray:
        count, width = self.count(node), int(node.type.shape[-1])
        if count == 0:
            return np.zeros((0, width), F32)
        return self.model.backend.read(self.buffers[node.id], F32, count * width).reshape(count, width)

    def new_kv(self, cache: SequenceKV) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Each layer's keys and values of the pass's rows, rounded to f16 as the device stored them,
        written into the host KVCache at slots length + i (in place) and returned."""
        t = self.n_rows
        flat = self.model.backend.read(self.kv_rows, F32, self.kv_bytes // 4).astype(np.float16)
        result, at = {}, 0
        for layer, (_, _, width) in sorted(self.kv_nodes.items()):
            k = flat[at : at + t * width].reshape(t, width)
            v = flat[at + t * width : at + 2 * t * width].reshape(t, width)
            at += 2 * t * width
            result[layer] = (k, v)
        cache.write_pass_rows(result)
        return result
