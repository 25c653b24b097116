"""A whole model's pass on a Vulkan device: the graph's ops in order, one command buffer per pass.

Owns: checking once that every op and weight of a graph has a Vulkan kernel (refusing with the
reason otherwise), uploading the weights once (a weight over one binding in parts of whole rows:
one lookup or matmul per part, the parts' columns then put in place), and per pass: the buffers of each node, the rotary
tables and visibility of the pass's rows, recording every node's dispatches into one command buffer
(device.run puts a barrier before each dispatch that reads what an earlier one wrote), and reading
back the logits. Does not own the cache's bookkeeping (the runtime's KVCache: length, positions,
rollback), its device copy (common/kv_mirror.py), the per-pass tables (common/tables.py) or the
arithmetic (the renderers, through VulkanOps' kernel cache).

The KV cache is resident on the device: each sequence's cache gets, on first use, a device copy of
its keys and values per layer (capacity n_ctx, f16), kept while the cache lives and in step by the
`host_writes` protocol (common/kv_mirror.py: a plain decode copies nothing up). A pass's keys and
values are stored (rounded to f16) by the device at slots length + i, attention reads them there, and
only those new rows are copied back into the host cache in place (`in_place` is True, as the CPU
step: the engine commits with commit_written / keep_written). One sequence per pass (a chain, or a
draft tree of one sequence).
"""

from __future__ import annotations

import atexit
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.common.kv_mirror import KVMirror, KVMirrors
from kinetic.codegen.common.tables import RopeTables, pass_mask
from kinetic.codegen.runner import RunnerOptions
from kinetic.codegen.vulkan import elementwise, gather, norm, rope
from kinetic.codegen.vulkan.device import (
    DeviceBuffer,
    Dispatch,
    Unsupported,
    VulkanDevice,
    VulkanError,
    VulkanUnavailable,
    physical_devices,
    preferred_device,
)
from kinetic.codegen.vulkan.executor import SUPPORTED_WEIGHTS, VulkanOps
from kinetic.codegen.vulkan.matvec import ROWS_PER_GROUP
from kinetic.errors import KineticError
from kinetic.ir import numerics
from kinetic.ir.graph import Graph, Node
from kinetic.ir.interpreter import WeightSource
from kinetic.ir.ops import Op
from kinetic.ir.rows import KVView, PassResult, PassRows, SequenceKV

F32 = np.float32
ELEMENTWISE = {Op.ADD: "add", Op.MUL: "mul", Op.SCALE: "scale", Op.SILU: "silu", Op.GELU: "gelu",
               Op.SWIGLU: "swiglu", Op.GEGLU: "geglu"}
HANDLED = set(ELEMENTWISE) | {Op.INPUT, Op.PARAM, Op.STATE, Op.EMBED, Op.MATMUL, Op.RMS_NORM, Op.ROPE,
                              Op.ATTENTION, Op.TAKE_ROWS}


def unsupported(graph: Graph) -> str | None:
    """Why this graph cannot run on Vulkan, or None."""
    for node in graph.nodes:
        a = node.attrs
        if node.op not in HANDLED:
            return f"{node.op.value} has no Vulkan kernel yet"
        if node.op is Op.MATMUL and a.activations != "q8":
            return f"matmul with {a.activations} activations has no Vulkan kernel (only q8)"
        if node.op is Op.MATMUL and graph.node(node.inputs[1]).type.ggml_type not in SUPPORTED_WEIGHTS:
            return f"matmul with {graph.node(node.inputs[1]).type.ggml_type.name} weights has no Vulkan kernel"
        if node.op is Op.EMBED and node.inputs and graph.node(node.inputs[0]).type.ggml_type is not Q.Q8_0:
            return f"embedding table of {graph.node(node.inputs[0]).type.ggml_type.name} (only Q8_0 has a kernel)"
        if node.op is Op.ROPE and (a.yarn_ext_factor or a.llama3_factor):
            return "rope with YaRN or llama3 scaling has no Vulkan kernel"
        if node.op is Op.ATTENTION and (a.kv_dtype != "f16" or a.softcap or a.head_dim % 64):
            return "attention needs an f16 cache, no soft-capping and heads of 64k values on Vulkan"
    return None


def open_runner(graph: Graph, weights: WeightSource, options: RunnerOptions | None = None) -> VulkanModel:
    """The runner for `--device vulkan` (it needs none of the options): the first Vulkan GPU (else the
    first device), this graph's weights on it. A CPU-type device (lavapipe) is used, with one line on
    stderr saying so; a missing loader or driver, or an op or weight type without a kernel, is a
    KineticError with the reason."""
    reason = unsupported(graph)
    if reason:
        raise KineticError(f"--device vulkan cannot run this model: {reason}", "Use --device cpu.")
    try:
        choice = preferred_device(physical_devices())
        if choice is None:
            raise VulkanUnavailable("no Vulkan device with Vulkan 1.2 or newer")
        device = VulkanDevice(choice.index)
    except VulkanUnavailable as e:
        raise KineticError(f"--device vulkan cannot run here: {e}", "Use --device cpu.") from e
    if device.caps.is_cpu:
        print(f"kinetic: --device vulkan is running on {device.caps.device_name}, a CPU implementation of Vulkan "
              "(correct, but slower than --device cpu)", file=sys.stderr)
    try:
        model = VulkanModel(graph, weights, device)
    except VulkanError as e:
        device.close()
        raise KineticError(f"--device vulkan cannot run this model: {e}", "Use --device cpu.") from e
    atexit.register(model.close_device)
    return model


class VulkanModel:
    """Runs passes of one graph on one device; the runner for `--device vulkan`."""

    in_place = True  # the pass's new cache rows are written into the host KVCache at slots length + i

    def __init__(self, graph: Graph, weights: WeightSource, device: VulkanDevice):
        reason = unsupported(graph)
        if reason:
            raise Unsupported(f"this model cannot run on Vulkan: {reason}")
        self.graph, self.device = graph, device
        self.ops = VulkanOps(device)
        self.weights: dict[str, DeviceBuffer] = {}  # f32 parameters
        self.parts: dict[str, list[tuple[int, int, DeviceBuffer]]] = {}  # quantized: (first row, rows, buffer)
        for node in graph.nodes:
            if node.op is Op.PARAM:
                self._upload(node, np.asarray(weights.tensor(node.attrs.tensor)))
        self._pool: dict[object, DeviceBuffer] = {}
        self._rope_tables: dict[tuple, RopeTables] = {}
        self.kv_mirrors = KVMirrors(alloc=device.buffer, write=lambda buf, at, rows: buf.write(rows, at),
                                    free=device.free, error=Unsupported, device="the Vulkan runner")

    def _upload(self, node: Node, raw: np.ndarray) -> None:
        """An f32 parameter as one buffer; a quantized weight as raw GGUF rows, split into parts of
        whole rows where it exceeds one binding (maxStorageBufferRange)."""
        name, wtype = node.attrs.tensor, node.type.ggml_type
        if wtype is Q.F32:
            self.weights[name] = self.device.upload(raw.astype(F32).reshape(-1))
            return
        raw = raw.reshape(raw.shape[0], -1)
        per_part = (self.device.caps.max_storage_buffer_range - 64) // raw.shape[1]
        per_part -= per_part % ROWS_PER_GROUP
        self.parts[name] = [(first, len(rows), self.ops.upload_weight(rows, wtype))
                            for first in range(0, raw.shape[0], per_part)
                            for rows in (raw[first : first + per_part],)]

    def buffer(self, key, nbytes: int) -> DeviceBuffer:
        """A device buffer of at least nbytes kept between passes under `key` (grown when too small)."""
        buf = self._pool.get(key)
        if buf is None or buf.size < nbytes:
            if buf is not None:
                self.device.free(buf)
            buf = self._pool[key] = self.device.buffer(max(nbytes, 16))
        return buf

    def rope_tables(self, key: tuple) -> RopeTables:
        if key not in self._rope_tables:
            self._rope_tables[key] = RopeTables(*key)
        return self._rope_tables[key]

    def close(self) -> None:
        parts = [b for bufs in self.parts.values() for _, _, b in bufs]
        for buf in [*self.weights.values(), *parts, *self._pool.values()]:
            self.device.free(buf)
        self.kv_mirrors.close()
        self.weights, self.parts, self._pool = {}, {}, {}

    def close_device(self) -> None:
        """Free everything and close the device (at exit, for the runner open_runner made)."""
        if self.device.device is not None:
            self.close()
            self.device.close()

    # ---- one pass ------------------------------------------------------------------------------
    def run(self, graph: Graph, rows: PassRows, kv: KVView) -> PassResult:
        if graph is not self.graph:
            raise ValueError("VulkanModel runs the graph it was built for")
        seqs = np.unique(rows.seqs)
        if len(seqs) > 1:
            raise Unsupported("one sequence per pass on Vulkan (several users' rows are not batched yet)")
        n_rows = {"T": len(rows.tokens), "R": len(rows.output_rows)}
        seq = int(seqs[0]) if len(seqs) else 0
        cache = kv.sequence(seq)  # the cache whose copy the device keeps
        cache.check_room(n_rows["T"])
        mirror = self.kv_mirrors.mirror(cache)
        plan = _Pass(self, rows, cache, mirror, n_rows)
        for node in graph.nodes:
            plan.node(node)
        self.device.run(plan.dispatches)
        outputs = {name: plan.read(graph.node(nid)) for name, nid in graph.outputs}
        return PassResult(outputs, plan.new_kv())


class _Pass:
    """The buffers and dispatches of one pass, built node by node."""

    def __init__(self, model: VulkanModel, rows: PassRows, cache: SequenceKV, mirror: KVMirror,
                 n_rows: dict[str, int]):
        self.model, self.ops, self.rows, self.n_rows = model, model.ops, rows, n_rows
        self.cache, self.mirror = cache, mirror
        self.dispatches: list[Dispatch] = []
        self.out: dict[int, DeviceBuffer] = {}
        self.caches: dict[int, tuple[DeviceBuffer, DeviceBuffer, int, int]] = {}  # layer -> k, v, n_committed, width
        self._visible: dict[int, DeviceBuffer] = {}
        self._rope: dict[tuple, tuple[DeviceBuffer, DeviceBuffer]] = {}
        self._slots_key, self._slots = None, None

    def count(self, node: Node) -> int:
        return self.n_rows[node.type.shape[0]]

    def width(self, node: Node) -> int:
        return int(node.type.shape[-1])

    def result(self, node: Node) -> DeviceBuffer:
        buf = self.model.buffer(("node", node.id), self.count(node) * self.width(node) * 4)
        self.out[node.id] = buf
        return buf

    def grid(self, groups: int):
        return self.ops.grid(groups)

    def read(self, node: Node) -> np.ndarray:
        shape = (self.count(node), self.width(node))
        return self.out[node.id].read(F32, shape[0] * shape[1]).reshape(shape)

    def u32(self, key, values: np.ndarray) -> DeviceBuffer:
        values = np.ascontiguousarray(values, np.uint32)
        buf = self.model.buffer(key, values.nbytes)
        buf.write(values)
        return buf

    def node(self, node: Node) -> None:
        op, a = node.op, node.attrs
        if op in (Op.PARAM, Op.STATE):
            return
        if op is Op.INPUT:
            values = {"tokens": self.rows.tokens, "positions": self.rows.positions,
                      "output_rows": self.rows.output_rows}[a.name]
            self.out[node.id] = self.u32(("input", a.name), values)
            return
        out = self.result(node)
        n = self.count(node)
        if n == 0:  # a pass without output rows: nothing to compute past take_rows
            return
        ins = [self.out.get(i) for i in node.inputs]
        graph = self.model.graph
        if op is Op.EMBED:
            width = self.width(node)
            k = self.ops.kernel(("embed_q8_0", width), lambda: gather.render_embed_q8_0(width))
            for first, count, table in self.model.parts[graph.node(node.inputs[0]).attrs.tensor]:
                self.dispatches.append(Dispatch(k, [table, ins[1], out], self.grid(-(-n * width // gather.WORKGROUP)),
                                                struct.pack("<3I", n, first, count)))
        elif op is Op.MATMUL:
            self.matmul(node, ins[0], out, n)
        elif op is Op.RMS_NORM:
            self.rms_norm(node, ins, out, n)
        elif op is Op.ROPE:
            self.rope(node, ins, out, n)
        elif op is Op.ATTENTION:
            self.attention(node, ins, out, n)
        elif op is Op.TAKE_ROWS:
            k = self.ops.kernel(("take_rows", self.width(node)), lambda: gather.render_take_rows(self.width(node)))
            self.dispatch(k, [ins[0], ins[1], out], n * self.width(node), gather.WORKGROUP, n)
        else:
            name = ELEMENTWISE[op]
            factor = a.factor if op is Op.SCALE else 1.0
            k = self.ops.kernel(("elementwise", name, factor if name == "scale" else None),
                                lambda: elementwise.render_elementwise(self.ops.target, name, factor))
            table = [self.gelu_table()] if name in ("gelu", "geglu") else []
            size = n * self.width(node)
            self.dispatch(k, [*ins, *table, out], size, elementwise.WORKGROUP, size)

    def matmul(self, node: Node, x, out, n: int) -> None:
        """One matmul per part of the weight; parts after a split are put in their columns."""
        graph = self.model.graph
        w, k_in, n_out = graph.node(node.inputs[1]), self.width(graph.node(node.inputs[0])), self.width(node)
        parts = self.model.parts[w.attrs.tensor]
        for i, (first, count, wbuf) in enumerate(parts):
            y = out if len(parts) == 1 else self.model.buffer(("part", node.id, i), n * count * 4)
            self.dispatches += self.ops.matmul_dispatches(
                x, y, wbuf, w.type.ggml_type, n, k_in, count,
                lambda slot, nbytes, i=i: self.model.buffer(("scratch", node.id, i, slot), nbytes))
            if len(parts) > 1:
                place = self.ops.kernel(("place_columns", count, n_out),
                                        lambda count=count: gather.render_place_columns(count, n_out))
                self.dispatches.append(Dispatch(place, [y, out], self.grid(-(-n * count // gather.WORKGROUP)),
                                                struct.pack("<2I", n, first)))

    def dispatch(self, kernel, buffers, invocations: int, workgroup: int, push: int) -> None:
        self.dispatches.append(Dispatch(kernel, buffers, self.grid(-(-invocations // workgroup)),
                                        struct.pack("<I", push)))

    def gelu_table(self) -> DeviceBuffer:
        key = ("gelu_table",)
        if key not in self.model._pool:
            self.model._pool[key] = self.model.device.upload(numerics.gelu_table().astype(F32))
        return self.model._pool[key]

    def rms_norm(self, node: Node, ins, out, n: int) -> None:
        a, width = node.attrs, self.width(node)
        g = a.group or width
        wlen = self.width(self.model.graph.node(node.inputs[1])) if len(ins) == 2 else 0
        f64 = self.ops.f64_norm
        k = self.ops.kernel(("rms_norm", width, g, float(a.eps), wlen, f64),
                            lambda: norm.render_rms_norm(self.ops.target, width, g, a.eps, wlen, f64))
        weight = [self.model.weights[self.model.graph.node(node.inputs[1]).attrs.tensor]] if wlen else []
        self.dispatches.append(Dispatch(k, [ins[0], *weight, out], self.grid(n * (width // g))))

    def rope(self, node: Node, ins, out, n: int) -> None:
        a = node.attrs
        key = (a.n_rot, a.theta, a.freq_scale)
        if key not in self._rope:
            cos, sin = self.model.rope_tables(key).rows(np.asarray(self.rows.positions))
            self._rope[key] = (self.model.buffer(("rope_cos", key), cos.nbytes),
                               self.model.buffer(("rope_sin", key), sin.nbytes))
            self._rope[key][0].write(np.ascontiguousarray(cos, F32))
            self._rope[key][1].write(np.ascontiguousarray(sin, F32))
        cos_buf, sin_buf = self._rope[key]
        k = self.ops.kernel(("rope", a.n_head, a.head_dim, a.n_rot, a.neox),
                            lambda: rope.render_rope(self.ops.target, a.n_head, a.head_dim, a.n_rot, a.neox))
        self.dispatch(k, [ins[0], cos_buf, sin_buf, out], n * a.n_head * (a.head_dim // 2), rope.WORKGROUP, n)

    def attention(self, node: Node, ins, out, n: int) -> None:
        """Store the pass's keys and values after the committed ones (in the sequence's device-resident
        cache), then attend."""
        a = node.attrs
        layer = self.model.graph.node(node.inputs[3]).attrs.layer
        width = a.n_kv_head * a.head_dim
        n_c = self.cache.length
        cpos = self.cache.positions[:n_c]
        kbuf, vbuf = self.mirror.k[layer], self.mirror.v[layer]
        self.caches[layer] = (kbuf, vbuf, n_c, width)
        if ("slots", n_c) != self._slots_key:
            self._slots_key = ("slots", n_c)
            self._slots = self.u32(("slots",), n_c + np.arange(n))
        slots = self._slots
        store = self.ops.kernel(("kv_store", width), lambda: gather.render_kv_store(width))
        self.dispatch(store, [ins[1], slots, kbuf], n * width // 2, gather.WORKGROUP, n)
        self.dispatch(store, [ins[2], slots, vbuf], n * width // 2, gather.WORKGROUP, n)
        if a.window not in self._visible:
            visible = pass_mask(self.rows, cpos, a.window)
            self._visible[a.window] = self.u32(("visible", a.window), visible)
        kernel = self.ops.attention_kernel(a)
        self.dispatches.append(Dispatch(kernel, [ins[0], kbuf, vbuf, self._visible[a.window],
                                                 self.ops.expf_table(), out],
                                        self.grid(n * a.n_head), struct.pack("<I", n_c + n)))

    def new_kv(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Each layer's keys and values of the pass's rows as the device stored them (f16), written into
        the host KVCache at slots length + i (in place, as the CPU step) and returned as copies."""
        n = self.n_rows["T"]
        result = {}
        for layer, (kbuf, vbuf, n_c, width) in self.caches.items():
            words, offset = n * width // 2, n_c * width * 2
            k, v = (b.read(np.uint32, words, offset).view(np.float16).reshape(n, width) for b in (kbuf, vbuf))
            result[layer] = (k, v)
        self.cache.write_pass_rows(result)
        return result
