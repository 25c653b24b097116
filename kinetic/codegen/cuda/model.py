"""A whole model's passes through the generated CUDA kernels: weights on the device, the KV cache on
the device, each pass shape recorded once and replayed (a CUDA graph on a GPU).

Owns: checking once that every op and weight of a graph has a CUDA kernel (refusing with the reason
otherwise), uploading the weights once, and per pass shape (rows T, output rows R) a `_Plan`: its
launches in graph order, its activation buffers (reused once a value is dead), and one staging
buffer for everything that changes between passes of that shape (tokens, output rows, the rotary
tables, the visibility masks, and `meta` = [keys, first new slot]), so a recorded plan replays
unchanged: on a GPU one host-to-device copy, one graph launch, one copy back. Does not own the
kernels (gemv.py, pointwise.py, attention.py, gather.py), the device calls (backends.py) or the
cache's bookkeeping (the runtime's KVCache: length, positions, rollback).

The KV cache: each sequence's KVCache gets, on first use, a device copy of its keys and values per
layer (capacity n_ctx, f16; `_Mirror`). A pass stores its rows' keys and values (rounded to f16) at
slots length + i on the device, attention reads them there, and the same rows come back in one copy
(the keys' and values' f32 rows sit side by side in one buffer; the host rounds them to f16 exactly
as the device did) and are written into the host KVCache in place (`in_place`, as the CPU step).
The host arrays stay the source of truth: KVCache counts the writes the host makes itself
(`host_writes`: keep_written moving a draft tree's kept rows, commit), and the next pass copies the
rows from the lowest one written up to the device first. Rollback needs nothing: the length governs
what attention reads.

Exactness: every kernel computes its reference's value bit for bit (RMS norm: see pointwise.py), and
a row's result never depends on the other rows of its launch, so a pass here equals the reference
interpreter's, and a batch equals its rows alone. CI runs this module whole on the host emulation
(backends.HostBackend) against the reference on both real models.
"""

from __future__ import annotations

import atexit
import itertools
import os
import sys
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cuda import gemv
from kinetic.codegen.cuda.backends import ALIGN
from kinetic.codegen.cuda.renderer import CudaRenderer
from kinetic.errors import KineticError
from kinetic.ir import numerics
from kinetic.ir.graph import Graph, Node
from kinetic.ir.interpreter import KVView, PassResult, PassRows, WeightSource, _visibility
from kinetic.ir.ops import Op
from kinetic.passes.split import LayerSplit, layer_of_nodes, n_layers, split_layers

F32 = np.float32
EMULATE_ENV = "KINETIC_CUDA_EMULATE"  # set (not 0): --device cuda runs on the host emulation (development, CI)
MAX_PLANS = 8  # pass shapes whose buffers are kept (decode, verification passes, prompt chunks)
MAX_RECORDINGS = 16  # recorded plans (CUDA graphs) kept: a plan per sequence cache it writes


def unsupported(graph: Graph) -> str | None:
    """Why this graph cannot run on CUDA (the first node without a kernel, and why), or None."""
    return next(iter(CudaRenderer().render(graph).unsupported.values()), None)


def open_runner(graph: Graph, weights: WeightSource, n_ctx: int, gpu_layers: int | None = None,
                cpu_runner=None):
    """The engine's executor for `--device cuda`: this graph's weights on the current GPU, or, for a
    model larger than the GPU or --gpu-layers N below its layer count, its last layers there and the
    first ones on the CPU (`cpu_runner(head_graph)` makes that executor). No usable GPU, an op or
    weight type without a kernel, or a model whose every layer would not fit is a KineticError with
    the reason; a split is one line on stderr."""
    from kinetic.codegen.cuda import emulator
    from kinetic.codegen.cuda.backends import GpuBackend, HostBackend
    from kinetic.codegen.cuda.device import unavailable_reason

    reason = unsupported(graph)
    if reason:
        raise KineticError(f"--device cuda cannot run this model: {reason}", "Use --device cpu.")
    emulate = os.environ.get(EMULATE_ENV, "") not in ("", "0")
    reason = emulator.unavailable_reason() if emulate else unavailable_reason()
    if reason:
        raise KineticError(f"--device cuda cannot run here: {reason}", "Use --device cpu.")
    if gpu_layers is not None and gpu_layers <= 0:
        raise KineticError(f"--gpu-layers {gpu_layers} puts no layer on the GPU", "Use --device cpu.")
    if emulate:
        print(f"kinetic: --device cuda is running on the host emulation of its kernels ({EMULATE_ENV}; exact, "
              "but far slower than --device cpu)", file=sys.stderr)
    backend = HostBackend() if emulate else GpuBackend()
    total = n_layers(graph)
    free = backend.free_bytes()
    on_gpu = min(gpu_layers or total, total)
    fit = layers_that_fit(graph, weights, n_ctx, free) if free is not None else total
    if fit < on_gpu:  # at most N layers: as many of the last ones as fit
        if fit == 0:
            raise KineticError(f"not even one layer of this model and its {n_ctx}-token cache fits in the "
                               f"{free / 2**30:.1f} GiB free on {backend.name}",
                               "Use a smaller context (-c N) or --device cpu.")
        on_gpu = fit
    model: CudaModel | SplitModel
    if on_gpu == total:
        model = CudaModel(graph, weights, backend, n_ctx)
    else:
        if cpu_runner is None:
            raise KineticError(f"only {on_gpu} of {total} layers fit on {backend.name}", "Use --device cpu.")
        split = split_layers(graph, total - on_gpu)
        model = SplitModel(cpu_runner(split.head), CudaModel(graph, weights, backend, n_ctx, split=split), split)
        print(f"kinetic: {on_gpu} of {total} layers on {backend.name}, the rest on the CPU", file=sys.stderr)
    atexit.register(model.close)
    return model


def layer_bytes(graph: Graph, weights: WeightSource, n_ctx: int) -> tuple[int, dict[int, int]]:
    """Device bytes outside the layers (output layer, final norm; the embedding table when the output
    layer reads it) and per layer (its weights and one sequence's f16 cache)."""
    top = layer_of_nodes(graph)
    users = graph.users()
    fixed, per_layer = 0, dict.fromkeys(range(n_layers(graph)), 0)
    for node in graph.nodes:
        if node.op is Op.PARAM:
            raw = weights.tensor(node.attrs.tensor)
            nbytes = raw.size * 4 if node.type.ggml_type is Q.F32 else raw.nbytes
            if top[node.id] >= 0:
                per_layer[top[node.id]] += nbytes
            elif any(top[u] >= 0 or graph.node(u).op is not Op.EMBED for u in users[node.id]):
                fixed += nbytes  # read after the layers (a tied output layer reads the embedding table)
        elif node.op is Op.ATTENTION:
            per_layer[top[node.id]] += 2 * n_ctx * node.attrs.n_kv_head * node.attrs.head_dim * 2
    return fixed, per_layer


def layers_that_fit(graph: Graph, weights: WeightSource, n_ctx: int, free: int) -> int:
    """How many of the last layers fit in `free` bytes with what runs after them, leaving room for
    the activations (a twentieth of the memory, at least 256 MiB)."""
    fixed, per_layer = layer_bytes(graph, weights, n_ctx)
    room = free - max(256 << 20, free // 20) - fixed
    count = 0
    for layer in sorted(per_layer, reverse=True):
        room -= per_layer[layer]
        if room < 0:
            break
        count += 1
    return count


class SplitModel:
    """A model's first layers on the CPU and the rest on the GPU: per pass the CPU runs the head graph
    (writing its layers' cache rows in place), then the GPU runs the rest from the hidden state."""

    in_place = True

    def __init__(self, cpu, gpu: CudaModel, split: LayerSplit):
        if not getattr(cpu, "in_place", False):
            raise ValueError("the CPU part of a split must write its cache rows in place")
        self.cpu, self.gpu, self.split = cpu, gpu, split

    def run(self, graph: Graph, rows: PassRows, kv: KVView) -> PassResult:
        hidden = self.cpu.run(self.split.head, rows, kv).outputs["hidden"]
        return self.gpu.run(graph, rows, kv, hidden=hidden)

    def close(self) -> None:
        self.gpu.close()


@dataclass(frozen=True)
class _Launch:
    """One kernel launch of a plan; `args` hold device views and numbers, and ("k"|"v", layer) for
    the sequence's cache, filled in when the plan is recorded for a sequence."""

    kernel: str
    rows: int
    args: tuple


class CudaModel:
    """Runs passes of one graph on one backend; the engine's executor for `--device cuda`."""

    in_place = True  # the pass's new cache rows are written into the host KVCache at slots length + i

    def __init__(self, graph: Graph, weights: WeightSource, backend, n_ctx: int, split: LayerSplit | None = None):
        reason = unsupported(graph)
        if reason:
            raise KineticError(f"this model cannot run on CUDA: {reason}", "Use --device cpu.")
        self.graph, self.backend, self.n_ctx, self.split = graph, backend, int(n_ctx), split
        # with a split, the first layers' nodes run elsewhere: their crossing value comes in as "hidden"
        self.skip = split.head_ids if split else frozenset()
        rendering = CudaRenderer(mask_stride=self.n_ctx).render(graph, self.skip)
        self.fused, self._kernels = rendering.fused, rendering.kernels
        backend.compile(list({k.name: k for ks in self._kernels.values() for k in ks}.values()))
        used = {i for n in graph.nodes if n.id not in self.skip for i in n.inputs}
        self.weights: dict[str, object] = {}
        for node in graph.nodes:
            if node.op is Op.PARAM and node.id in used:
                raw = np.asarray(weights.tensor(node.attrs.tensor))
                raw = raw.astype(F32) if node.type.ggml_type is Q.F32 else raw
                self.weights[node.attrs.tensor] = buf = backend.empty(raw.nbytes)
                backend.write(buf, raw)
        self.gelu = None
        if any(n.op in (Op.GELU, Op.GEGLU) for n in graph.nodes if n.id not in self.skip):
            table = numerics.gelu_table().view(np.uint16)
            self.gelu = backend.empty(table.nbytes)
            backend.write(self.gelu, table)
        self.kv_layers = {graph.node(n.inputs[3]).attrs.layer: n for n in graph.nodes
                          if n.op is Op.ATTENTION and n.id not in self.skip}
        self._plans: OrderedDict[tuple[int, int], _Plan] = OrderedDict()
        self._recordings: OrderedDict[tuple[int, int, int], object] = OrderedDict()
        self._mirrors: dict[int, _Mirror] = {}
        self._rope: dict[tuple, _RopeTables] = {}
        tables = [graph.node(n.inputs[0]) for n in graph.nodes if n.op is Op.EMBED and n.id not in self.skip]
        self.vocab = int(tables[0].type.shape[0]) if tables else None  # rows the embedding lookup reads

    def rope_tables(self, key: tuple) -> _RopeTables:
        if key not in self._rope:
            self._rope[key] = _RopeTables(*key)
        return self._rope[key]

    # ---- plans and recordings --------------------------------------------------------------------
    def plan(self, n_rows: int, n_out: int) -> _Plan:
        key = (n_rows, n_out)
        plan = self._plans.pop(key, None) or _Plan(self, n_rows, n_out)
        self._plans[key] = plan
        while len(self._plans) > MAX_PLANS:
            old, _ = self._plans.popitem(last=False)
            for rkey in [r for r in self._recordings if r[:2] == old]:
                del self._recordings[rkey]
        return plan

    def recording(self, plan: _Plan, mirror: _Mirror):
        """The plan's launches for this sequence's cache, recorded once (a CUDA graph on a GPU)."""
        key = (plan.n_rows, plan.n_out, mirror.serial)
        replay = self._recordings.pop(key, None)
        if replay is None:
            caches = {"k": mirror.k, "v": mirror.v}
            launches = [(x.kernel, x.rows, tuple(caches[a[0]][a[1]] if isinstance(a, tuple) else a for a in x.args))
                        for x in plan.launches]
            replay = self.backend.record(launches)
        self._recordings[key] = replay
        while len(self._recordings) > MAX_RECORDINGS:
            self._recordings.popitem(last=False)
        return replay

    def mirror(self, cache) -> _Mirror:
        """The device copy of a KVCache, made on first use, brought up to date with the rows the host
        wrote since its last pass. The copies of KVCaches that no longer exist are dropped here."""
        for key, m in list(self._mirrors.items()):
            if m.cache() is None or (key == id(cache) and m.cache() is not cache):
                self._drop(key)
        m = self._mirrors.get(id(cache))
        if m is None:
            m = self._mirrors[id(cache)] = _Mirror(self.backend, cache, sorted(self.kv_layers))
        m.sync(cache)
        return m

    def _drop(self, key: int) -> None:
        serial = self._mirrors.pop(key).serial
        for rkey in [r for r in self._recordings if r[2] == serial]:
            del self._recordings[rkey]

    # ---- one pass --------------------------------------------------------------------------------
    def run(self, graph: Graph, rows: PassRows, kv: KVView, hidden: np.ndarray | None = None) -> PassResult:
        """One pass; with a split, `hidden` is the first layers' output for the pass's rows."""
        if graph is not self.graph:
            raise ValueError("CudaModel runs the graph it was built for")
        seqs = np.unique(rows.seqs)
        if len(seqs) > 1:
            raise KineticError("one sequence per pass on CUDA (several users' rows are not batched yet)")
        seq = int(seqs[0]) if len(seqs) else 0
        cache = kv.caches[seq]  # the engine's SequenceCaches: the KVCache whose copy the device keeps
        n, r = len(rows.tokens), len(rows.output_rows)
        cache.check_room(n)
        if self.vocab is not None and n and not (0 <= int(rows.tokens.min()) and int(rows.tokens.max()) < self.vocab):
            raise KineticError(f"a token id is outside the vocabulary (0..{self.vocab - 1})",
                               "Check the token ids of the prompt.")
        if cache.n_ctx != self.n_ctx:
            raise ValueError(f"the cache holds {cache.n_ctx} entries; this runner was built for {self.n_ctx}")
        mirror = self.mirror(cache)
        plan = self.plan(n, r)
        if (hidden is None) != (self.split is None):
            raise ValueError("a split runner takes the first layers' hidden state, and only a split one")
        plan.fill(rows, cache, hidden)
        self.backend.write(plan.inputs, plan.staging[: plan.input_bytes])
        self.recording(plan, mirror)()
        outputs = {name: plan.read(self.graph.node(nid)) for name, nid in self.graph.outputs}
        return PassResult(outputs, plan.new_kv(cache))

    def close(self) -> None:
        self._recordings.clear()
        self._plans.clear()
        self._mirrors.clear()
        self.weights, self.gelu = {}, None
        self.backend.close()


class _RopeTables:
    """cos and sin [rows, n_rot/2] of one rotary key's angles per position, as numerics.rope_cos_sin
    computes them (the C library's cosf / sinf), made a block of positions at a time: through the CPU
    JIT's map over an array when it is there (a decode step's new position costs nothing then), else
    numerics' own call per value."""

    BLOCK = 256

    def __init__(self, n_rot: int, theta: float, freq_scale: float):
        self.n_rot, self.theta, self.freq_scale = n_rot, theta, freq_scale
        self.blocks: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def rows(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        first = positions // self.BLOCK
        for b in np.unique(first).tolist():
            if b not in self.blocks:
                self.blocks[b] = self._block(b)
        if len(positions) == 1:
            cos, sin = self.blocks[int(first[0])]
            at = int(positions[0]) % self.BLOCK
            return cos[at : at + 1], sin[at : at + 1]
        return tuple(np.stack([self.blocks[int(p) // self.BLOCK][i][int(p) % self.BLOCK] for p in positions])
                     for i in (0, 1))

    def _block(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        angles = numerics.rope_angles(np.arange(b * self.BLOCK, (b + 1) * self.BLOCK), self.n_rot, self.theta,
                                      self.freq_scale)
        return _libm_map("cosf", angles), _libm_map("sinf", angles)


def _libm_map(name: str, x: np.ndarray) -> np.ndarray:
    """The C library's float function over an array (numerics.libm_f32's values), compiled once."""
    try:
        import ctypes

        from kinetic.codegen.cpu.jit import default_jit
        from kinetic.codegen.cpu.libm_ir import render_libm_map

        fn = _LIBM_MAPS.get(name)
        if fn is None:
            address = default_jit().address(*render_libm_map(name))
            fn = _LIBM_MAPS[name] = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(address)
    except Exception:  # no LLVM here: the reference's own path
        return numerics.libm_f32(name, x)
    x = np.ascontiguousarray(x, F32)
    out = np.empty_like(x)
    fn(x.ctypes.data, out.ctypes.data, x.size)
    return out


_LIBM_MAPS: dict[str, object] = {}


class _Mirror:
    """One KVCache's keys and values on the device (the runner's layers): per layer a buffer of n_ctx
    rows (f16) for each.
    Rows [0, cache.length) equal the host's once sync() has run."""

    _serials = itertools.count()

    def __init__(self, backend, cache, layers: list[int]):
        self.backend = backend
        self.serial = next(self._serials)  # names its recordings (ids of dead objects come back)
        self.cache = weakref.ref(cache)
        self.k = {layer: backend.empty(cache.k[layer].nbytes) for layer in layers}
        self.v = {layer: backend.empty(cache.v[layer].nbytes) for layer in layers}
        for host in cache.k.values():
            if host.dtype != np.float16:
                raise KineticError("the CUDA runner keeps an f16 cache")
        self.seen = None  # the cache's host_writes when last in sync; None: nothing copied yet

    def sync(self, cache) -> None:
        writes = cache.host_writes
        if writes == self.seen:
            return
        start = cache.host_written_from if self.seen is not None and writes == self.seen + 1 else 0
        if cache.length > start:
            for layer, buf in self.k.items():
                row = cache.k[layer].strides[0]
                self.backend.write(buf[start * row :], cache.k[layer][start : cache.length])
                self.backend.write(self.v[layer][start * row :], cache.v[layer][start : cache.length])
        self.seen = writes


class _Plan:
    """The launches and buffers of one pass shape: n_rows rows (T), n_out output rows (R)."""

    def __init__(self, model: CudaModel, n_rows: int, n_out: int):
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
        self.launches: list[_Launch] = []
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
        last_use = {}
        for i, node in enumerate(graph.nodes):
            for j in node.inputs:
                last_use[j] = i
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
            if node.id in self.buffers:  # a norm its add's launch computes (fused_norms)
                continue
            if node.id in kv_at:
                out = kv_at[node.id]
            else:
                out = take(n * width * 4)
            self.buffers[node.id] = out
            if node.id in self.model.fused:
                norm = self.model.fused[node.id]
                self.buffers[norm] = kv_at[norm] if norm in kv_at else take(n * width * 4)
            if n:
                self._launches(node, n, out, quantized, scratch_of, take)
            for j in set(node.inputs):
                if last_use.get(j) == i and j not in pinned and j not in kv_at and self.buffers.get(j) is not None \
                        and graph.node(j).op not in (Op.INPUT, Op.PARAM, Op.STATE):
                    give(self.buffers[j])
                    for buf in scratch_of.pop(j, []):
                        give(buf)

    def count(self, node: Node) -> int:
        return self.counts[node.type.shape[0]]

    def _launches(self, node: Node, n: int, out, quantized, scratch_of, take) -> None:
        model, graph, add = self.model, self.model.graph, self.launches.append
        kernels = model._kernels[node.id]
        ins = [self.buffers.get(j) for j in node.inputs]
        op, a = node.op, node.attrs
        if op is Op.EMBED:
            add(_Launch(kernels[0].name, n, (model.weights[graph.node(node.inputs[0]).attrs.tensor], ins[1], out)))
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
                add(_Launch(quantize.name, n, (ins[0], *acts)))
                quantized[key] = tuple(acts)
            weight = model.weights[w.attrs.tensor]
            if n == 1:
                add(_Launch(one_row.name, n, (weight, *quantized[key], out)))
            else:  # each weight block read once per tile of rows; every row's result the GEMV's
                add(_Launch(tiled.name, n, (weight, *quantized[key], out, n)))
        elif op is Op.RMS_NORM:
            weight = (model.weights[graph.node(node.inputs[1]).attrs.tensor],) if len(ins) == 2 else ()
            add(_Launch(kernels[0].name, n, (ins[0], *weight, out)))
        elif op is Op.ROPE:
            key = (a.n_rot, float(a.theta), float(a.freq_scale))
            tables = (self.input_view(("cos", key)), self.input_view(("sin", key)))
            add(_Launch(kernels[0].name, n, (ins[0], *tables, out)))
        elif op is Op.ATTENTION:
            store, attend = kernels
            layer = graph.node(node.inputs[3]).attrs.layer
            meta = self.input_view("meta")
            add(_Launch(store.name, n, (ins[1], ins[2], meta, ("k", layer), ("v", layer))))
            add(_Launch(attend.name, n, (ins[0], ("k", layer), ("v", layer), self.input_view(("mask", a.window)),
                                         meta, out)))
        elif op is Op.TAKE_ROWS:
            add(_Launch(kernels[0].name, n, (ins[0], ins[1], out)))
        elif node.id in model.fused:
            norm = graph.node(model.fused[node.id])
            weight = (model.weights[graph.node(norm.inputs[1]).attrs.tensor],) if len(norm.inputs) == 2 else ()
            add(_Launch(kernels[0].name, n, (ins[0], ins[1], *weight, out, self.buffers[norm.id])))
        else:
            table = (model.gelu,) if op in (Op.GELU, Op.GEGLU) else ()
            add(_Launch(kernels[0].name, n, (*ins, *table, out)))

    # -- per pass
    def fill(self, rows: PassRows, cache, hidden: np.ndarray | None = None) -> None:
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
        mine, cpos = np.arange(t), np.asarray(cache.positions[:n_c])
        for w in self.windows:
            mask = self.staged(("mask", w), np.uint8).reshape(t, self.model.n_ctx)
            mask[:, : n_c + t] = _visibility(rows, mine, cpos, w)

    def read(self, node: Node) -> np.ndarray:
        count, width = self.count(node), int(node.type.shape[-1])
        if count == 0:
            return np.zeros((0, width), F32)
        return self.model.backend.read(self.buffers[node.id], F32, count * width).reshape(count, width)

    def new_kv(self, cache) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Each layer's keys and values of the pass's rows, rounded to f16 as the device stored them,
        written into the host KVCache at slots length + i (in place) and returned."""
        t, n_c = self.n_rows, cache.length
        flat = self.model.backend.read(self.kv_rows, F32, self.kv_bytes // 4).astype(np.float16)
        result, at = {}, 0
        for layer, (_, _, width) in sorted(self.kv_nodes.items()):
            k = flat[at : at + t * width].reshape(t, width)
            v = flat[at + t * width : at + 2 * t * width].reshape(t, width)
            at += 2 * t * width
            cache.k[layer][n_c : n_c + t] = k
            cache.v[layer][n_c : n_c + t] = v
            result[layer] = (k, v)
        return result
