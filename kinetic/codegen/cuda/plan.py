"""One pass shape's work on the CUDA runtime: its launches in graph order, its buffers, and the
staging buffer of everything that changes between passes of that shape.

Owns: `Plan` (built once per (rows T, output rows R): buffers reused once a value is dead, the
quantized copy of an input shared by the matmuls that read it, the GEMV for one row and the GEMM for
more, the fused chains the renderer names; per pass, filling the staging buffer and reading the
outputs and the new keys and values back). Does not own the device calls (backends.py), the kernels
(renderer.py and the kernel modules), the per-pass tables it stages (rotary cos/sin and visibility
masks: kinetic/codegen/common/tables.py) or the model-level state: weights, the sequences' caches,
recordings (model.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kinetic.codegen.common.tables import pass_mask
from kinetic.codegen.cuda import gemv
from kinetic.codegen.cuda.backends import ALIGN
from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import Op
from kinetic.ir.rows import PassRows, SequenceKV

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
                                 for n in mine if n.op is Op.ROPE})
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
        def reads(node: Node) -> tuple[int, ...]:
            early = self.model.rope_pairs.get(node.id)  # a fused rotary pair launches at the later one
            return node.inputs + (graph.node(early).inputs if early is not None else ())

        last_use = {}
        for i, node in enumerate(graph.nodes):
            for j in reads(node):
                last_use[j] = max(last_use.get(j, -1), i)
        skip, split = self.model.skip, self.model.split
        pinned = {nid for _, nid in graph.outputs} | ({split.boundary} if split else set())
        kv_at, at = {}, 0
        for _layer, (k_node, v_node, width) in sorted(self.kv_nodes.items()):
            for nid in (k_node, v_node):
                kv_at[nid] = self.kv_rows[at : at + self.n_rows * width * 4]
                at += self.n_rows * width * 4
        free: dict[int, list] = {}
        scratch_of: dict[int, list] = {}  # node id -> buffers of its quantized copies (dead with it)
        quantized: dict[tuple[int, str], tuple] = {}

        def take(nbytes: int):
            nbytes = max(-(-nbytes // ALIGN) * ALIGN, ALIGN)
            pool = free.get(nbytes)
            return pool.pop() if pool else backend.empty(nbytes)

        def give(buf) -> None:
            free.setdefault(buf.nbytes, []).append(buf)

        for i, node in enumerate(graph.nodes):
            if split and node.id == split.boundary:
                self.buffers[node.id] = self.input_view("hidden")
                continue
            if node.op is Op.INPUT:
                name = node.attrs.name
                self.buffers[node.id] = self.input_view(name) if name in ("tokens", "output_rows") else None
                continue
            if node.op in (Op.PARAM, Op.STATE) or node.id in skip:
                continue
            n = self.count(node)
            width = int(node.type.shape[-1])
            if node.id not in self.buffers:  # (a norm its add's launch computes has one already)
                out = self.buffers[node.id] = kv_at[node.id] if node.id in kv_at else take(n * width * 4)
                if node.id in self.model.fused:
                    norm = self.model.fused[node.id]
                    self.buffers[norm] = kv_at[norm] if norm in kv_at else take(n * width * 4)
                if n and self.model._kernels[node.id]:  # (the earlier rotary of a fused pair launches later)
                    self._launches(node, n, out, quantized, scratch_of, take)
            for j in set(reads(node)):  # values read for the last time: their buffers serve again
                if last_use.get(j) == i and j not in pinned and j not in kv_at and self.buffers.get(j) is not None \
                        and graph.node(j).op not in (Op.INPUT, Op.PARAM, Op.STATE):
                    give(self.buffers[j])
                    for buf in scratch_of.pop(j, []):
                        give(buf)

    def _quantized_row(self, norm_id: int, n: int, quantized, scratch_of, take) -> tuple:
        """The quantized row a norm's or GLU's launch also writes (renderer.quantized_norms), registered
        as the quantized copy its matmuls read; () when it writes none."""
        fmt = self.model.quantized.get(norm_id)
        if fmt is None:
            return ()
        k = int(self.model.graph.node(norm_id).type.shape[-1])
        block = 256 if fmt == "q8_k" else 32
        acts = (take(n * k), take(n * (k // block) * 4)) + ((take(n * (k // 32) * 4),) if fmt == "q8_1" else ())
        scratch_of.setdefault(norm_id, []).extend(acts)
        quantized[(norm_id, fmt)] = acts
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

    def _launches(self, node: Node, n: int, out, quantized, scratch_of, take) -> None:
        model, graph, add = self.model, self.model.graph, self.launches.append
        kernels = model._kernels[node.id]
        ins = [self.buffers.get(j) for j in node.inputs]
        op, a = node.op, node.attrs
        if op is Op.EMBED:
            add(Launch(kernels[0].name, n, (model.weights[graph.node(node.inputs[0]).attrs.tensor], ins[1], out)))
        elif op is Op.MATMUL:
            quantize, one_row, tiled = kernels
            w = graph.node(node.inputs[1])
            fmt = gemv.activation_format(w.type.ggml_type)
            k = int(w.type.shape[1])
            key = (node.inputs[0], fmt)
            if key not in quantized:  # q, k and v (gate and up) projections share one quantized input
                block = 256 if fmt == "q8_k" else 32
                acts = [take(n * k), take(n * (k // block) * 4)] + ([take(n * (k // 32) * 4)] if fmt == "q8_1" else [])
                scratch_of.setdefault(node.inputs[0], []).extend(acts)
                add(Launch(quantize.name, n, (ins[0], *acts)))
                quantized[key] = tuple(acts)
            weight = model.weights[w.attrs.tensor]
            if n == 1:
                add(Launch(one_row.name, n, (weight, *quantized[key], out)))
            else:  # each weight block read once per tile of rows; every row's result the GEMV's
                add(Launch(tiled.name, n, (weight, *quantized[key], out, n)))
        elif op is Op.RMS_NORM:
            weight = (model.weights[graph.node(node.inputs[1]).attrs.tensor],) if len(ins) == 2 else ()
            acts = self._quantized_row(node.id, n, quantized, scratch_of, take)
            add(Launch(kernels[0].name, n, (ins[0], *weight, out, *acts)))
        elif op is Op.ROPE:
            key = (a.n_rot, float(a.theta), float(a.freq_scale))
            tables = (self.input_view(("cos", key)), self.input_view(("sin", key)))
            early = model.rope_pairs.get(node.id)
            if early is None:
                add(Launch(kernels[0].name, n, (ins[0], *tables, out)))
            else:  # the layer's earlier rotary in the same launch (its input and output are kept till now)
                other = graph.node(early)
                add(Launch(kernels[0].name, n, (self.buffers[other.inputs[0]], ins[0], *tables,
                                                self.buffers[early], out)))
        elif op is Op.ATTENTION:
            store, one_warp, parallel = kernels
            layer = graph.node(node.inputs[3]).attrs.layer
            meta = self.input_view("meta")
            add(Launch(store.name, n, (ins[1], ins[2], meta, ("k", layer), ("v", layer))))
            cache = (ins[0], ("k", layer), ("v", layer), self.input_view(("mask", a.window)), meta)
            if n * a.n_head * 2 * model.n_ctx * 4 <= model.attention_scratch_bytes:
                acts = self._quantized_row(node.id, n, quantized, scratch_of, take)
                add(Launch(parallel.name, n, (*cache, self.attention_scratch(n * a.n_head), out, *acts)))
            else:
                add(Launch(one_warp.name, n, (*cache, out)))
        elif op is Op.TAKE_ROWS:
            add(Launch(kernels[0].name, n, (ins[0], ins[1], out)))
        elif node.id in model.fused:
            norm = graph.node(model.fused[node.id])
            weight = (model.weights[graph.node(norm.inputs[1]).attrs.tensor],) if len(norm.inputs) == 2 else ()
            acts = self._quantized_row(norm.id, n, quantized, scratch_of, take)
            add(Launch(kernels[0].name, n, (ins[0], ins[1], *weight, out, self.buffers[norm.id], *acts)))
        else:
            table = (model.gelu,) if op in (Op.GELU, Op.GEGLU) else ()
            acts = self._quantized_row(node.id, n, quantized, scratch_of, take)
            add(Launch(kernels[0].name, n, (*ins, *table, out, *acts)))

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
