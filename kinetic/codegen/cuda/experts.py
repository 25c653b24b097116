"""Flywheel on the CUDA runner: a mixture-of-experts model whose experts do not all fit in GPU memory
(docs/moe.md).

Owns: `ExpertOffload`, the runner's side of Flywheel's placement (kinetic/codegen/common/flywheel.py
decides; this module carries the decisions out): the expert cache on the device (one pool of equal
slots, each holding one layer's expert: its gate, up and down matrices side by side), the host steps
a pass runs between its recorded launches (after each moe_select: read the chosen experts, ask
Flywheel where each runs, copy the ones it copies up, and write each slot row's cache slot; after
each expert GEMV: compute the slot rows whose expert runs on the CPU and write them over the GEMV's
rows), the prefetch of the next MoE layer's likely experts after a layer's last GEMV, the measured
costs fed back to Flywheel (CPU seconds per byte and row, copy seconds per byte), the log of every
decision (`log`, which the tests replay through a fresh Flywheel), and `record_with_host_steps`
(a plan's launches recorded as device segments between host steps). Does not own the decisions
(flywheel.py), the kernels (moe.py), buffers (plan.py) or the memory budget (model.py).

Exactness: an expert computes the same bits wherever it runs. On the GPU it is moe.expert_gemv on its
cache slot (the GEMV's arithmetic); on the CPU it is numerics.matmul on the file's memory-mapped
bytes, the reference moe_matmul asks for (moe_reference.py), which every device's GEMV equals bit for
bit. So placement never changes a token. The experts stay memory-mapped in host memory; the device
holds only the cache. When every expert fits, this module is not used: routing stays on the device
and a pass is one recorded graph (model.py).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from functools import partial

import numpy as np

from kinetic.codegen.common.flywheel import Budget, Costs, Flywheel, Rate, Where
from kinetic.codegen.cuda import moe
from kinetic.codegen.cuda.backends import ALIGN
from kinetic.errors import KineticError
from kinetic.ir import numerics
from kinetic.ir.graph import Graph
from kinetic.ir.moe_reference import slot_inputs
from kinetic.ir.ops import Op
from kinetic.passes.split import layer_of_nodes

F32 = np.float32
# first guesses until measurements come in: a CPU expert reads ~20 GB/s, a copy up ~12 GB/s (PCIe),
# the GPU ~1 TB/s; so a decode row's miss runs on the CPU and a prompt's many rows copy the expert up
INITIAL_COSTS = {"cpu": 1 / 20e9, "copy": 1 / 12e9, "gpu": 1 / 1000e9}


@dataclass(frozen=True)
class MoeLayer:
    """One MoE feed-forward: its layer, its moe_select node and the moe_matmul nodes reading it."""

    layer: int
    select: int
    matmuls: tuple[int, ...]


def moe_layers(graph: Graph) -> list[MoeLayer]:
    top = layer_of_nodes(graph)
    by_select: dict[int, list[int]] = {}
    for node in graph.nodes:
        if node.op is Op.MOE_MATMUL:
            by_select.setdefault(node.inputs[2], []).append(node.id)
    return [MoeLayer(top[sid], sid, tuple(ids)) for sid, ids in sorted(by_select.items())]


def n_experts(graph: Graph, layer: MoeLayer) -> int:
    """How many experts the layer's stacks hold (their first dimension)."""
    return int(graph.node(graph.node(layer.matmuls[0]).inputs[1]).type.shape[0])


def expert_count(graph: Graph) -> int:
    """The experts of every MoE layer together."""
    return sum(n_experts(graph, ml) for ml in moe_layers(graph))


def stack_ids(graph: Graph) -> frozenset[int]:
    """The stacked expert weights' param node ids."""
    return frozenset(n.inputs[1] for n in graph.nodes if n.op is Op.MOE_MATMUL)


def stacks_bytes(graph: Graph, weights) -> int:
    """Bytes of every expert stack as the device would hold them."""
    return sum(np.asarray(weights.tensor(graph.node(i).attrs.tensor)).nbytes for i in stack_ids(graph))


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def slot_layout(graph: Graph, weights) -> tuple[dict[int, int], dict[int, int], int]:
    """Per moe_matmul node: its matrix's byte offset in a cache slot and one expert's bytes of it;
    and the slot's size (the largest layer's gate, up and down side by side, each aligned)."""
    offset, nbytes, slot = {}, {}, 0
    for ml in moe_layers(graph):
        at = 0
        for mid in ml.matmuls:
            raw = np.asarray(weights.tensor(graph.node(graph.node(mid).inputs[1]).attrs.tensor))
            offset[mid], nbytes[mid] = at, raw.nbytes // raw.shape[0]
            at += _aligned(nbytes[mid])
        slot = max(slot, at)
    return offset, nbytes, slot


def record_with_host_steps(backend, launches: list[tuple]):
    """A plan's launches recorded as runs of device launches (one recording each: a CUDA graph on a
    GPU) between host steps (a callable in place of the kernel name, called with the args)."""
    segments, run = [], []
    for name, rows, args in launches:
        if callable(name):
            if run:
                segments.append(backend.record(run))
                run = []
            segments.append(partial(name, *args))
        else:
            run.append((name, rows, args))
    if run:
        segments.append(backend.record(run))

    def replay() -> None:
        for segment in segments:
            segment()

    return replay


class ExpertOffload:
    """The expert cache of `cache_bytes` on `backend` for a lowered graph, and its host steps."""

    def __init__(self, graph: Graph, weights, backend, cache_bytes: int, kernels: dict[int, list]):
        self.graph, self.backend = graph, backend
        self.layers = moe_layers(graph)
        self.raw = {graph.node(i).attrs.tensor: np.asarray(weights.tensor(graph.node(i).attrs.tensor))
                    for i in stack_ids(graph)}  # stack tensor name -> its memory-mapped bytes [E, ...]
        # moe_matmul id -> its matrix's byte offset in a slot, and one expert's bytes of it
        self.offset, self.bytes, self.slot_bytes = slot_layout(graph, weights)
        n_slots = cache_bytes // self.slot_bytes
        if n_slots < 1:
            raise KineticError(f"the GPU has no room for even one expert ({self.slot_bytes} bytes)",
                               "Use --device cpu, or free GPU memory.")
        self.pool = backend.empty(n_slots * self.slot_bytes)
        self.free_slots = list(range(n_slots - 1, -1, -1))
        self.slot_of: dict[tuple[int, int], int] = {}
        n_expert = max(n_experts(graph, ml) for ml in self.layers)
        costs = Costs(**{k: Rate(v) for k, v in INITIAL_COSTS.items()})
        self.flywheel = Flywheel(Budget(n_slots * self.slot_bytes, 0, 0),
                                 {ml.layer: self.slot_bytes for ml in self.layers}, n_expert, costs)
        self.log: list[tuple] = []  # ("place", layer, rows per expert, decisions) and ("prefetch", layer, experts)
        self._dequantized: dict[tuple[str, int], numerics.DequantizedWeight] = {}
        self._routed: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # select id -> ids [T*k], run-on-CPU mask
        self._tables: dict[int, object] = {}  # while a plan is built: select id -> its slot table buffer
        self._layer_of = {sid: ml for ml in self.layers for sid in (ml.select, *ml.matmuls)}
        for ml in self.layers:  # the GEMVs read the cache's slots
            for mid in ml.matmuls:
                node = graph.node(mid)
                _, n_out, k = (int(d) for d in graph.node(node.inputs[1]).type.shape)
                kernels[mid][-1] = moe.expert_gemv(graph.node(node.inputs[1]).type.ggml_type, n_slots, n_out, k,
                                                   stride=self.slot_bytes)

    def status(self) -> str:
        return self.flywheel.status()

    # ---- the plan's launches -----------------------------------------------------------------------
    def launches(self, node, kernels, *, ins, out, n: int, take, plain) -> list[tuple]:
        steps = plain()
        if node.op is Op.MOE_SELECT:
            n_used = int(node.type.shape[1])
            (table,) = take(n * n_used * 4)
            self._tables[node.id] = table
            return steps + [(partial(self._route, self._layer_of[node.id], n, n_used), n, (out, table))]
        if node.op is not Op.MOE_MATMUL:
            return steps
        name, rows, args = steps[-1]
        pooled = self.pool[self.offset[node.id]:]
        return steps[:-1] + [(name, rows, (pooled, self._tables[node.inputs[2]], *args[2:])),
                             (partial(self._cpu_rows, node, n), n, (ins[0], out))]

    # ---- host steps --------------------------------------------------------------------------------
    def _route(self, ml: MoeLayer, n: int, n_used: int, ids_buf, table_buf) -> None:
        """After moe_select: where each chosen expert runs, the copies up, each slot row's cache slot."""
        ids = self.backend.read(ids_buf, F32, n * n_used).astype(np.int64)
        rows = dict(Counter(int(e) for e in ids))
        before = set(self.flywheel.cache.resident)
        where = self.flywheel.place(ml.layer, rows)
        self.log.append(("place", ml.layer, rows, where))
        self._sync_cache(before, ml)
        on_cpu = np.array([where[int(e)] is Where.CPU for e in ids])
        # a slot row run on the CPU reads slot 0 (its GEMV row is overwritten by _cpu_rows)
        slots = [0 if cpu else self.slot_of[(ml.layer, int(e))] for e, cpu in zip(ids, on_cpu, strict=True)]
        table = np.array(slots, F32)
        self.backend.write(table_buf, table)
        self._routed[ml.select] = (ids, on_cpu)

    def _sync_cache(self, before: set, ml: MoeLayer) -> None:
        """The device pool made to hold what Flywheel's cache now says: evicted slots freed, new
        experts copied in (the copy's time measured)."""
        after = set(self.flywheel.cache.resident)
        for key in before - after:
            self.free_slots.append(self.slot_of.pop(key))
        for key in sorted(after - before):
            slot = self.slot_of[key] = self.free_slots.pop()
            layer = next(m for m in self.layers if m.layer == key[0])
            start, nbytes = time.perf_counter(), 0
            for mid in layer.matmuls:
                raw = self.raw[self.graph.node(self.graph.node(mid).inputs[1]).attrs.tensor][key[1]]
                at = slot * self.slot_bytes + self.offset[mid]
                self.backend.write(self.pool[at:], raw)
                nbytes += raw.nbytes
            self.backend.synchronize()
            self.flywheel.costs.copy.observe(time.perf_counter() - start, nbytes)

    def _cpu_rows(self, node, n: int, x_buf, out_buf) -> None:
        """After an expert GEMV: the slot rows whose expert runs on the CPU, computed from the file's
        bytes (numerics.matmul, the reference's product) and written over the GEMV's rows; after the
        layer's last GEMV, the next MoE layer's prefetch."""
        ml = self._layer_of[node.id]
        ids, on_cpu = self._routed[ml.select]
        weight = self.graph.node(node.inputs[1])
        _, n_out, k = (int(d) for d in weight.type.shape)
        if on_cpu.any():
            width = int(self.graph.node(node.inputs[0]).type.shape[1])
            x = self.backend.read(x_buf, F32, n * width).reshape(n, width)
            per_slot = slot_inputs(x, len(ids) // n, k).reshape(-1, k)
            for expert in np.unique(ids[on_cpu]):
                slots = np.nonzero(on_cpu & (ids == expert))[0]
                start = time.perf_counter()
                y = numerics.matmul(np.ascontiguousarray(per_slot[slots], F32), self._weight(weight, int(expert)),
                                    node.attrs.activations)
                self.flywheel.costs.cpu.observe(time.perf_counter() - start, self.bytes[node.id] * len(slots))
                for slot, row in zip(slots, y, strict=True):
                    self.backend.write(out_buf[int(slot) * n_out * 4:], np.ascontiguousarray(row, F32))
        if node.id == ml.matmuls[-1]:
            self._prefetch(ml)

    def _prefetch(self, ml: MoeLayer) -> None:
        following = self.layers[(self.layers.index(ml) + 1) % len(self.layers)]
        before = set(self.flywheel.cache.resident)
        chosen = self.flywheel.prefetch(following.layer)
        self.log.append(("prefetch", following.layer, chosen))
        self._sync_cache(before, following)

    def _weight(self, node, expert: int) -> numerics.DequantizedWeight:
        key = (node.attrs.tensor, expert)
        if key not in self._dequantized:
            raw = self.raw[node.attrs.tensor][expert]
            self._dequantized[key] = numerics.DequantizedWeight(raw.reshape(raw.shape[0], -1), node.type.ggml_type)
        return self._dequantized[key]
