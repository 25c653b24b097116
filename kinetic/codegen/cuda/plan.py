"""One pass shape's work on the CUDA runtime: its launches in graph order, its buffers, and the
staging buffer of everything that changes between passes of that shape.

Owns: `Plan` (built once per (rows T, output rows R): one launch per node that has kernels, at the
position the model's `LaunchOrder` gives (launch_order.py, shared by every shape), the GEMV for one
row and the GEMM for more; the values the launches write placed in one arena by the shared liveness
planner (common/buffers.py), so a dead value's bytes serve again; per pass, filling the staging
buffer (with the rows of every lookup the host makes for a table type without a CUDA kernel:
common/host_lookup.py; the embed node then has no launch and its value is that part of the inputs)
and reading the outputs and the new keys and values back). The fused launches are read from the
graph the device phase made: an add_rms_norm launches where its add stands and writes both values,
a rope_pair writes its other rotation too, a producer that an in-producer quantize reads writes the
quantized row that quantize node stands for, and every matmul reads its quantize node's row; a
recurrent op's launch walks the pass's rows, writing each row's state into `state_after`.
Does not own the device calls (backends.py), the kernels (renderer.py and the kernel modules), the
per-pass tables it stages (rotary cos/sin: kinetic/codegen/common/tables.py; each row's cache and
visibility: common/pass_caches.py; recurrent states: pass_states.py) or the model-level state:
weights, the pool of the sequences' caches, recordings (model.py).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kinetic.codegen.common.buffers import Value, plan_buffers
from kinetic.codegen.common.pass_caches import PassCaches
from kinetic.codegen.cuda import moe, pass_states
from kinetic.codegen.cuda.backends import ALIGN
from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import Op
from kinetic.ir.rows import PassRows

F32 = np.float32
# attention_rows (8 warps per (row, head), the keys' scores and factors in parallel) for every pass
# whose scratch of factors, rows x heads x 2 x n_ctx floats, stays within this; the one-warp kernel
# (no scratch) beyond, where many rows keep the GPU busy anyway
ATTENTION_SCRATCH_BYTES = 64 << 20


class Launch(NamedTuple):
    """One kernel launch of a plan; `args` hold device views and numbers, and ("k"|"v", layer) for
    the layer's pool of caches (common/kv_mirror.py), filled in when the plan is recorded."""

    kernel: str
    rows: int
    args: tuple


class _Slot:
    """One buffer a launch reads or writes, while the launches are built: `offset` bytes into the
    value `value` (an index into the plan's values), `nbytes` long; its `view` of the arena once the
    planner has placed the values."""

    __slots__ = ("value", "offset", "nbytes", "view")

    def __init__(self, value: int, offset: int, nbytes: int):
        self.value, self.offset, self.nbytes, self.view = value, offset, nbytes, None


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
        # each recurrent state after each row of the pass (pass_states.py), f32 [T, rows*width]
        self.state_after = {name: backend.empty(4 * n_rows * r * w) for name, (r, w) in model.recurrent.items()}
        self.buffers: dict[int, object] = {}
        self.launches: list[Launch] = []
        self._scratch = None
        self._build(graph, backend)

    # -- layout of what changes per pass
    def _layout_inputs(self) -> None:
        graph, t = self.model.graph, self.n_rows
        fields = [("tokens", 4 * t), ("output_rows", 4 * max(self.n_out, 1)), ("meta", 8), ("kv_rows", 8 * t)]
        split = self.model.split
        if split:
            fields.append(("hidden", 4 * t * int(graph.node(split.boundary).type.shape[-1])))
        self.rope_keys, self.windows = self.model.order.rope_keys, self.model.order.windows
        for key in self.rope_keys:
            fields += [(("cos", key), 4 * t * (key[0] // 2)), (("sin", key), 4 * t * (key[0] // 2))]
        fields += [(("mask", w), t * self.model.n_ctx) for w in self.windows]
        fields += pass_states.input_fields(self.model.recurrent, t)
        # a prediction block's rows of the trunk (an input `hidden.<width>`, PassRows.hidden), f32 [T, width]
        self.hidden_inputs = [n.attrs.name for n in self.model.order.inputs if n.attrs.name.startswith("hidden.")]
        fields += [(name, 4 * t * int(name.removeprefix("hidden."))) for name in self.hidden_inputs]
        # the rows of each lookup the host makes (common/host_lookup.py), f32 [rows, width]
        fields += [(("lookup", nid), 4 * self.count(graph.node(nid)) * lookup.width)
                   for nid, lookup in self.model.host_lookups.items()]
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

    # -- the launches, then the arena their values live in
    def _build(self, graph: Graph, backend) -> None:
        """Every launch in graph order, each value it writes a `_Slot` (taken at the launch's
        position); then the planner places the slots in one arena and the launches get their views."""
        order, split = self.model.order, self.model.split
        self.quantized_by = order.quantized_by
        self.kv_at, at = {}, 0
        for _layer, (k_node, v_node, width) in sorted(self.kv_nodes.items()):
            for nid in (k_node, v_node):
                self.kv_at[nid] = self.kv_rows[at : at + self.n_rows * width * 4]
                at += self.n_rows * width * 4
        self.rows_of: dict[int, tuple] = {}  # quantize node id -> its row's buffers (xq, xd[, xs])
        self._values: list[tuple[int, int, int]] = []  # per value: whose (node id), bytes, position written
        self._slots: list[_Slot] = []
        for node in order.inputs:
            name = node.attrs.name
            per_pass = name in ("tokens", "output_rows") or name.startswith("hidden.")
            self.buffers[node.id] = self.input_view(name) if per_pass else None
        if split:
            self.buffers[split.boundary] = self.input_view("hidden")
        for nid in self.model.host_lookups:  # no launch: the rows come with the pass's inputs
            self.buffers[nid] = self.input_view(("lookup", nid))
        for self._position, launch in order.launches:
            self._launches(launch)
        outputs = {nid for _, nid in graph.outputs}  # read back after the pass: live to its end
        self._place(backend, outputs, order.last_read)

    def _take(self, owner: int, *parts: int) -> list[_Slot]:
        """One value of node `owner` (its output, or a quantize node's row), written at the current
        position and live until `owner` is last read: its parts end to end, each aligned."""
        value, at, slots = len(self._values), 0, []
        for nbytes in parts:
            nbytes = -(-nbytes // ALIGN) * ALIGN or ALIGN
            slots.append(_Slot(value, at, nbytes))
            at += nbytes
        self._values.append((owner, at, self._position))
        self._slots += slots
        return slots

    def _place(self, backend, outputs: set[int], last_read: dict[int, int]) -> None:
        """The values planned into one arena (common/buffers.py: a value shares bytes only with values
        dead before its writer runs), and every slot replaced by its view of the arena; of the values'
        buffers, the outputs' are kept (`read`)."""
        values = [Value(i, nbytes, first, None if owner in outputs else last_read.get(owner, first))
                  for i, (owner, nbytes, first) in enumerate(self._values)]
        plan = plan_buffers(values, align=ALIGN)
        starts, total = plan.offsets(ALIGN)
        self.activations = arena = backend.empty(total)  # every value the launches write
        buffer_of, cut = plan.buffer_of, {}  # cut: (start, bytes) -> the view, cut once
        for slot in self._slots:
            key = (starts[buffer_of[slot.value]] + slot.offset, slot.nbytes)
            if key not in cut:
                cut[key] = arena[key[0] : key[0] + key[1]]
            slot.view = cut[key]
        self.launches = [Launch(kernel, rows, tuple([a.view if type(a) is _Slot else a for a in args]))
                         for kernel, rows, args in self.launches]
        kept = {nid: self.buffers[nid] for nid in outputs}
        self.buffers = {nid: buf.view if type(buf) is _Slot else buf for nid, buf in kept.items()}
        del self._values, self._slots, self.rows_of

    def _output(self, node: Node):
        """A slot for a node's value (its slot of the keys' and values' rows for an attention's k, v)."""
        if node.id in self.kv_at:
            buf = self.kv_at[node.id]
        else:  # _take's one-part case, written out: a plan takes one per launched node
            nbytes = -(-self.count(node) * int(node.type.shape[-1]) * 4 // ALIGN) * ALIGN or ALIGN
            buf = _Slot(len(self._values), 0, nbytes)
            self._values.append((node.id, nbytes, self._position))
            self._slots.append(buf)
        self.buffers[node.id] = buf
        return buf

    def _quantized_row(self, producer: Node) -> tuple:
        """The buffers of the quantized row a producer's launch also writes (for the in-producer
        quantize node that reads it), or () when it writes none."""
        q = self.quantized_by.get(producer.id)
        return () if q is None or not self.count(q) else self._row_buffers(q)

    def _row_buffers(self, q: Node) -> tuple:
        """A quantize node's row: int8 values, f32 scales (and Q8_1's f32 sums), as quantize.py writes;
        live until the quantize node's last reader."""
        n, k, fmt = self.count(q), int(q.type.shape[-1]), q.attrs.format
        block = 256 if fmt == "q8_k" else 32
        sums = (n * (k // 32) * 4,) if fmt == "q8_1" else ()
        acts = tuple(self._take(q.id, n * k, n * (k // block) * 4, *sums))
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
        return self.input_view(("cos", a.rotary)), self.input_view(("sin", a.rotary))

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
            # a quantize node's row; float weights' kernels read the f32 rows and round them themselves
            quantized = graph.node(node.inputs[0]).op is Op.QUANTIZE
            row = self.rows_of[node.inputs[0]] if quantized else (ins[0],)
            if n == 1:
                add(Launch(one_row.name, n, (weight, *row, out)))
            else:  # each weight block read once per tile of rows; every row's result the GEMV's
                add(Launch(tiled.name, n, (weight, *row, out, n)))
        elif op is Op.RMS_NORM:
            weight = (model.weights[graph.node(node.inputs[1]).attrs.tensor],) if len(ins) == 2 else ()
            add(Launch(kernels[0].name, n, (ins[0], *weight, out, *self._quantized_row(node))))
        elif op is Op.LAYER_NORM:  # one block per row (layer_norm.py)
            weight = (model.weights[graph.node(node.inputs[1]).attrs.tensor],) if len(ins) == 2 else ()
            add(Launch(kernels[0].name, n, (ins[0], *weight, out)))
        elif op is Op.ROPE:
            add(Launch(kernels[0].name, n, (ins[0], *self._rope_tables(a), out)))
        elif op is Op.ATTENTION:
            store, one_warp, parallel = kernels[:3]
            layer = graph.node(node.inputs[3]).attrs.layer
            meta, kv_rows = self.input_view("meta"), self.input_view("kv_rows")
            add(Launch(store.name, n, (ins[1], ins[2], kv_rows, ("k", layer), ("v", layer))))
            cache = (ins[0], ("k", layer), ("v", layer), self.input_view(("mask", a.window)), meta, kv_rows)
            row = self._quantized_row(node)
            if n * a.n_head * 2 * model.n_ctx * 4 <= model.attention_scratch_bytes:
                add(Launch(parallel.name, n, (*cache, self.attention_scratch(n * a.n_head), out, *row)))
            else:  # the one-warp kernel writes no quantized row: the quantizer after it does
                add(Launch(one_warp.name, n, (*cache, out)))
                if row:
                    add(Launch(kernels[3].name, n, (out, *row)))
        elif op is Op.TAKE_ROWS:
            add(Launch(kernels[0].name, n, (ins[0], ins[1], out)))
        elif op in (Op.SHORT_CONV, Op.SSM_SCAN, Op.DELTA_RULE):  # one block row walks the rows (recurrent.py)
            name = graph.node(node.inputs[-1]).attrs.name  # the state, the last input
            values = [model.weights[graph.node(j).attrs.tensor] if graph.node(j).op is Op.PARAM else self.buffers[j]
                      for j in node.inputs[:-1]]
            add(Launch(kernels[0].name, 1, (*values, self.input_view(("rstate", name)), self.input_view("parents"),
                                            self.state_after[name], out, n)))
        elif op in moe.OPS:  # routing on the device, each slot row a GEMV of its expert
            steps = moe.launches(node, graph, kernels, ins=ins, out=out, n=n,
                                 take=lambda *nbytes: self._take(node.id, *nbytes),
                                 weight=lambda nid: model.weights.get(graph.node(nid).attrs.tensor),
                                 experts=getattr(model, "experts", None))
            for name, count, args in steps:
                add(Launch(name, count, args))
        elif op is Op.ADD_BIAS:
            add(Launch(kernels[0].name, n, (ins[0], model.weights[graph.node(node.inputs[1]).attrs.tensor], out)))
        else:
            table = (model.gelu,) if op in (Op.GELU, Op.GEGLU) else ()
            add(Launch(kernels[0].name, n, (*ins, *table, out, *self._quantized_row(node))))

    # -- per pass
    def fill(self, rows: PassRows, caches: PassCaches, hidden: np.ndarray | None = None) -> None:
        """Write what this pass's launches read into the host staging buffer: with the rows, where
        each row's cache is in the pool (kv_rows: its store slot and its cache's first row) and
        which of its cache's keys it sees (the masks)."""
        t = self.n_rows
        if hidden is not None:
            self.staged("hidden", F32)[:] = np.ascontiguousarray(hidden, F32).reshape(-1)
        self.staged("tokens", np.int32)[:] = rows.tokens
        for name in self.hidden_inputs:
            self.staged(name, F32)[:] = rows.input(name).reshape(-1)
        if self.n_out:
            self.staged("output_rows", np.int32)[:] = rows.output_rows
        self.staged("meta", np.int32)[:] = (caches.n_keys, 0)
        self.staged("kv_rows", np.int32)[:] = np.stack([caches.store, caches.base], axis=1).reshape(-1)
        for nid, lookup in self.model.host_lookups.items():
            self.staged(("lookup", nid), F32)[:] = lookup.rows(rows).reshape(-1)
        for key in self.rope_keys:
            cos, sin = self.model.rope_tables(key).rows(np.asarray(rows.positions))
            self.staged(("cos", key), F32)[:] = cos.reshape(-1)
            self.staged(("sin", key), F32)[:] = sin.reshape(-1)
        for w in self.windows:
            mask = self.staged(("mask", w), np.uint8).reshape(t, self.model.n_ctx)
            mask[:, : caches.n_keys] = caches.mask(rows, w)

    def read(self, node: Node) -> np.ndarray:
        count, width = self.count(node), int(node.type.shape[-1])
        if count == 0:
            return np.zeros((0, width), F32)
        return self.model.backend.read(self.buffers[node.id], F32, count * width).reshape(count, width)

    def new_kv(self, caches: PassCaches) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Each layer's keys and values of the pass's rows, rounded to f16 as the device stored them,
        written into each sequence's host KVCache at its slots length + k (in place) and returned."""
        t = self.n_rows
        flat = self.model.backend.read(self.kv_rows, F32, self.kv_bytes // 4).astype(np.float16)
        result, at = {}, 0
        for layer, (_, _, width) in sorted(self.kv_nodes.items()):
            k = flat[at : at + t * width].reshape(t, width)
            v = flat[at + t * width : at + 2 * t * width].reshape(t, width)
            at += 2 * t * width
            result[layer] = (k, v)
        caches.write_back(result)
        return result
