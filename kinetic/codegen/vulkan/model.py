"""A whole model's pass on a Vulkan device: the graph's ops in order, one command buffer per pass.

Owns: the runner for `--device vulkan` (`open_runner`, `VulkanModel`): refusing a graph the kernel
table does not cover (kernels.py: unsupported) with the reason, uploading the weights once (a weight
over one binding in parts of whole rows: one lookup or matmul per part, the parts' columns then put
in place; not a table only host lookups read: common/host_lookup.py), and per pass: recording every
node's dispatches (recorder.py, through the table), giving the pass's activation values buffers by
one liveness plan per pass shape (common/buffers.py: a dead value's buffer serves a later one),
running them in one command buffer (device.run puts a barrier before each dispatch that needs one)
and reading back the outputs and the new cache rows. Does not own the cache's bookkeeping (the
runtime's KVCache: length, positions, rollback), its device copy (common/kv_mirror.py), the per-pass
tables (common/tables.py) or the arithmetic (the renderers, through VulkanOps' kernel cache).

The KV cache is resident on the device: each sequence's cache gets, on first use, a slot in the
device's pool of caches (per layer one buffer of keys and one of values, n_ctx f16 rows per slot),
kept while the cache lives and in step by the `host_writes` protocol (common/kv_mirror.py: a plain
decode copies nothing up). A pass may hold the rows of several sequences (Convoy: chains, draft
trees, one part per sequence): each row's keys and values are stored (rounded to f16) by the device
at its own cache's slots length + k, each row attends over its own cache only (its cache's first
pool row and its mask: common/pass_caches.py), and only those new rows are copied back into each
sequence's host cache in place (`in_place` is True, as the CPU step: the engine commits with
commit_written / keep_written). A pool buffer stays within one binding (maxStorageBufferRange): more
caches alive at once than that holds is a KineticError saying how many fit.

Recurrent states (docs/recurrent.md) stay the runtime's: per pass the host writes each parentless
row's committed state and reads back the states the runtime keeps (pass_states.py: PassResult.new_state).
"""

from __future__ import annotations

import atexit
import sys
from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.common.buffers import BufferPlan, plan_buffers
from kinetic.codegen.common.host_lookup import host_lookups, read_on_device
from kinetic.codegen.common.kv_mirror import KVMirrors
from kinetic.codegen.common.pass_caches import PassCaches
from kinetic.codegen.common.tables import RopeTables
from kinetic.codegen.runner import RunnerOptions
from kinetic.codegen.vulkan.device import (
    DeviceBuffer,
    Unsupported,
    VulkanDevice,
    VulkanError,
    VulkanUnavailable,
    physical_devices,
    preferred_device,
)
from kinetic.codegen.vulkan.embed import SUPPORTED as LOOKUP_TYPES
from kinetic.codegen.vulkan.kernels import CAPABILITIES, unsupported
from kinetic.codegen.vulkan.matvec import ROWS_PER_GROUP
from kinetic.codegen.vulkan.moe_records import refuse_moe_on
from kinetic.codegen.vulkan.ops import VulkanOps
from kinetic.codegen.vulkan.pass_states import PassStates
from kinetic.codegen.vulkan.recorder import PassRecorder
from kinetic.errors import KineticError
from kinetic.ir.graph import Graph, Node
from kinetic.ir.interpreter import WeightSource
from kinetic.ir.numerics import Rotary
from kinetic.ir.ops import Op
from kinetic.ir.rows import KVView, PassResult, PassRows

__all__ = ["CAPABILITIES", "VulkanModel", "open_runner", "unsupported"]

F32 = np.float32
ALIGN = 16  # bytes: what device.buffer rounds every buffer up to
PLANS_KEPT = 16  # pass shapes (rows, output rows) whose buffer plan is kept


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
    capabilities = CAPABILITIES

    def __init__(self, graph: Graph, weights: WeightSource, device: VulkanDevice):
        reason = unsupported(graph)
        if reason:
            raise Unsupported(f"this model cannot run on Vulkan: {reason}")
        self.graph, self.device = graph, device
        self.ops = VulkanOps(device)
        self.weights: dict[str, DeviceBuffer] = {}  # f32 parameters
        self.parts: dict[str, list[tuple[int, int, DeviceBuffer]]] = {}  # quantized: (first row, rows, buffer)
        # lookups from tables without a Vulkan kernel: the host writes their rows each pass (recorder.py);
        # a table only they read is not uploaded
        self.host_lookups = host_lookups(graph, weights, LOOKUP_TYPES)
        read = read_on_device(graph, self.host_lookups)
        sizes = {n.attrs.tensor: np.asarray(weights.tensor(n.attrs.tensor)).nbytes
                 for n in graph.nodes if n.op is Op.PARAM and n.id in read}
        refuse_moe_on(graph, sizes, device.caps)  # every expert stays on the device (no Flywheel here)
        for node in graph.nodes:
            if node.op is Op.PARAM and node.id in read:
                self._upload(node, np.asarray(weights.tensor(node.attrs.tensor)))
        self._pool: dict[object, DeviceBuffer] = {}  # per-pass inputs and constants, by key
        self._activations: list[DeviceBuffer] = []  # the buffers of the liveness plans, by index
        self._plans: dict[tuple[int, int], BufferPlan] = {}
        self._rope_tables: dict[Rotary, RopeTables] = {}
        self.kv_mirrors = KVMirrors(alloc=device.buffer, write=lambda buf, at, rows: buf.write(rows, at),
                                    free=device.free, max_buffer_bytes=device.caps.max_storage_buffer_range,
                                    error=Unsupported, device="the Vulkan runner")

    def _upload(self, node: Node, raw: np.ndarray) -> None:
        """An f32 vector parameter as one buffer; a matrix (quantized, or F32 matmul weights) as raw
        GGUF rows, split into parts of whole rows where it exceeds one binding (maxStorageBufferRange)."""
        name, wtype = node.attrs.tensor, node.type.ggml_type
        if wtype is Q.F32 and len(node.type.shape) == 1:
            self.weights[name] = self.device.upload(raw.astype(F32).reshape(-1))
            return
        raw = raw.reshape(int(node.type.shape[0]), -1)  # rows as the graph says (a [1, n] tensor reads as [n])
        per_part = (self.device.caps.max_storage_buffer_range - 64) // (raw.nbytes // raw.shape[0])
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

    def constant(self, key, make: Callable[[], np.ndarray]) -> DeviceBuffer:
        """The array make() returns, uploaded once and kept under `key`."""
        if key not in self._pool:
            self._pool[key] = self.device.upload(make())
        return self._pool[key]

    def rope_tables(self, key: Rotary) -> RopeTables:
        if key not in self._rope_tables:
            self._rope_tables[key] = RopeTables(key)
        return self._rope_tables[key]

    def activation_bytes(self) -> int:
        """Device memory held by the passes' activation values (the liveness plans' buffers)."""
        return sum(buf.size for buf in self._activations)

    def _bind(self, recorder: PassRecorder, shape: tuple[int, int]) -> None:
        """Give the recorded pass's values buffers: the plan of its shape (made on first use), its
        buffers grown where the plan needs more than an earlier shape did."""
        plan = self._plans.get(shape)
        if plan is None:
            if len(self._plans) >= PLANS_KEPT:
                self._plans.clear()
            plan = self._plans[shape] = plan_buffers(recorder.values(), align=ALIGN)
        for i, size in enumerate(plan.sizes):
            if i == len(self._activations):
                self._activations.append(self.device.buffer(size))
            elif self._activations[i].size < size:
                self.device.free(self._activations[i])
                self._activations[i] = self.device.buffer(size)
        recorder.bind({key: self._activations[i] for key, i in plan.buffer_of.items()})

    def close(self) -> None:
        parts = [b for bufs in self.parts.values() for _, _, b in bufs]
        for buf in [*self.weights.values(), *parts, *self._pool.values(), *self._activations]:
            self.device.free(buf)
        self.kv_mirrors.close()
        self.weights, self.parts, self._pool, self._activations, self._plans = {}, {}, {}, [], {}

    def close_device(self) -> None:
        """Free everything and close the device (at exit, for the runner open_runner made)."""
        if self.device.device is not None:
            self.close()
            self.device.close()

    # ---- one pass ------------------------------------------------------------------------------
    def run(self, graph: Graph, rows: PassRows, kv: KVView) -> PassResult:
        if graph is not self.graph:
            raise ValueError("VulkanModel runs the graph it was built for")
        n_rows = {"T": len(rows.tokens), "R": len(rows.output_rows)}
        caches = PassCaches.of(rows, kv, self.kv_mirrors)  # each row's cache in the pool, brought up to date
        recorder = PassRecorder(self, rows, caches, n_rows)
        recorder.states = PassStates(self, rows, kv)  # each row's starting recurrent states (pass_states.py)
        recorder.record()
        self._bind(recorder, (n_rows["T"], n_rows["R"]))
        self.device.run(recorder.dispatches)
        outputs = {name: recorder.read(graph.node(nid)) for name, nid in graph.outputs}
        return PassResult(outputs, recorder.new_kv(), recorder.states.read())

