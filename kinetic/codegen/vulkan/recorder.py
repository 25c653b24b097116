"""One pass of a graph on a Vulkan device, recorded node by node: its dispatches, its per-pass
inputs, and its activation values, bound to buffers once the pass is recorded.

Owns: `PassRecorder` (what a row of the kernel table records through: row counts and widths, the
planned result of a node and its temporaries, the host-written per-pass inputs (token ids, rotary
tables, the rows of host lookups: common/host_lookup.py; each row's store slot, cache start and
visibility, from common/pass_caches.py), the device's pool of cache rows of each layer, binding the
planned values to buffers, reading outputs back, and the pass's new cache rows) and `Planned`, a
value's stand-in until the pass is bound. Does not own which kernels a node gets (kernels.py:
KERNELS), how values share buffers (kinetic/codegen/common/buffers.py), the buffers themselves or
the weights (the runner, model.py), nor where each row's cache is (common/pass_caches.py).

Planning. Every activation value a pass writes (each node's result, a matmul's quantized copy of its
input, a split weight's partial columns) is a `Planned` stand-in while the nodes are recorded. Its
live range is counted in barrier epochs, not nodes: epoch e is the run of dispatches between the
e-th barrier device.run puts and the next (device.barrier_points, each value its own buffer: these
barriers order the dataflow, whatever the plan). A value is live from the epoch of the first
dispatch that touches it to the epoch of the last (a graph output: after the pass), and the liveness
plan (common/buffers.py) lets two values share a buffer only when a barrier lies between the last
use of one and the first write of the other. So reusing a buffer adds no barrier: the command
buffer has the barriers it had with a buffer per value, and every value its writer's bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from kinetic.codegen.common.buffers import Value
from kinetic.codegen.common.pass_caches import PassCaches
from kinetic.codegen.vulkan.dispatch import DeviceBuffer, Dispatch, barrier_points
from kinetic.codegen.vulkan.kernels import KERNELS
from kinetic.ir.graph import Node
from kinetic.ir.numerics import Rotary
from kinetic.ir.rows import PassRows

if TYPE_CHECKING:
    from kinetic.codegen.vulkan.model import VulkanModel

F32 = np.float32


@dataclass(frozen=True, eq=False)
class Planned:
    """An activation value of the pass (f32 or scratch bytes), standing in for its buffer until
    `PassRecorder.bind`; known by identity, as buffers are."""

    key: tuple
    nbytes: int
    recorded_at: int  # dispatches recorded before it: where a value no dispatch touches lives


class PassRecorder:
    """The dispatches and values of one pass, recorded node by node in graph order."""

    def __init__(self, model: VulkanModel, rows: PassRows, caches: PassCaches, n_rows: dict[str, int]):
        self.model, self.graph, self.ops = model, model.graph, model.ops
        self.rows, self.n_rows, self.caches = rows, n_rows, caches
        self.dispatches: list[Dispatch] = []
        self.out: dict[int, DeviceBuffer | Planned] = {}
        self.planned: list[Planned] = []
        self.kv_layers: dict[int, tuple[DeviceBuffer, DeviceBuffer, int]] = {}  # layer -> k pool, v pool, width
        self._visible: dict[int, DeviceBuffer] = {}
        self._rope: dict[Rotary, tuple[DeviceBuffer, DeviceBuffer]] = {}
        self._slots: DeviceBuffer | None = None
        self._starts: DeviceBuffer | None = None
        self.states = None  # the recurrent states' walk buffers (pass_states.PassStates), set by the runner

    def record(self) -> None:
        for node in self.graph.nodes:
            KERNELS[node.op].emit(self, node)

    # ---- shapes and grids ----------------------------------------------------------------------
    def count(self, node: Node) -> int:
        return self.n_rows[node.type.shape[0]]

    def width(self, node: Node) -> int:
        return int(node.type.shape[-1])

    def grid(self, groups: int):
        return self.ops.grid(groups)

    def dispatch(self, kernel, buffers, invocations: int, workgroup: int, push: int) -> None:
        """One dispatch of ceil(invocations / workgroup) workgroups with one u32 push constant."""
        self.dispatches.append(Dispatch(kernel, buffers, self.grid(-(-invocations // workgroup)),
                                        struct.pack("<I", push)))

    # ---- planned values ------------------------------------------------------------------------
    def result(self, node: Node) -> Planned:
        """The node's result f32 [rows, width]."""
        value = self.out[node.id] = self.value(("node", node.id), self.count(node) * self.width(node) * 4)
        return value

    def value(self, key: tuple, nbytes: int) -> Planned:
        """A value of the pass, live while dispatches recorded after this use it."""
        value = Planned(key, nbytes, len(self.dispatches))
        self.planned.append(value)
        return value

    def values(self) -> list[Value]:
        """The recorded values with their live ranges in barrier epochs (see the module docstring)."""
        epoch_of, epoch = [], 0
        for barrier in barrier_points(self.dispatches):
            epoch += barrier
            epoch_of.append(epoch)
        epoch_of.append(epoch)  # where values recorded after the last dispatch live
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for i, d in enumerate(self.dispatches):
            for b in d.buffers:
                if isinstance(b, Planned):
                    first.setdefault(id(b), epoch_of[i])
                    last[id(b)] = epoch_of[i]
        outputs = {id(self.out[nid]) for _, nid in self.graph.outputs}
        values = []
        for v in self.planned:
            start = first.get(id(v), epoch_of[v.recorded_at])
            values.append(Value(v.key, v.nbytes, start, None if id(v) in outputs else last.get(id(v), start)))
        return values

    def bind(self, buffer_of: dict[tuple, DeviceBuffer]) -> None:
        """Put each value's buffer in place of its stand-in, in the dispatches and the results."""
        def real(b):
            return buffer_of[b.key] if isinstance(b, Planned) else b

        self.dispatches = [replace(d, buffers=[real(b) for b in d.buffers]) for d in self.dispatches]
        self.out = {nid: real(b) for nid, b in self.out.items()}

    # ---- per-pass inputs, written by the host --------------------------------------------------
    def u32(self, key, values: np.ndarray) -> DeviceBuffer:
        values = np.ascontiguousarray(values, np.uint32)
        buf = self.model.buffer(key, values.nbytes)
        buf.write(values)
        return buf

    def gelu_table(self) -> DeviceBuffer:
        return self.model.constant(("gelu_table",), self.ops.gelu_table)

    def rope_tables(self, key: Rotary) -> tuple[DeviceBuffer, DeviceBuffer]:
        """The pass's rotary cos and sin rows for one rotary key (RopeAttrs.rotary), written once per pass."""
        if key not in self._rope:
            cos, sin = self.model.rope_tables(key).rows(np.asarray(self.rows.positions))
            self._rope[key] = (self.model.buffer(("rope_cos", key), cos.nbytes),
                               self.model.buffer(("rope_sin", key), sin.nbytes))
            self._rope[key][0].write(np.ascontiguousarray(cos, F32))
            self._rope[key][1].write(np.ascontiguousarray(sin, F32))
        return self._rope[key]

    def looked_up(self, node: Node) -> DeviceBuffer:
        """An embed node's rows f32 [rows, width], dequantized by the host (common/host_lookup.py: a
        table type without a lookup kernel), written once per pass."""
        rows = self.model.host_lookups[node.id].rows(self.rows)
        buf = self.model.buffer(("lookup", node.id), rows.nbytes)
        buf.write(rows)
        return buf

    def slots(self) -> DeviceBuffer:
        """The pool rows the pass's rows are stored at: each its own cache's length + k."""
        if self._slots is None:
            self._slots = self.u32(("slots",), self.caches.store)
        return self._slots

    def cache_starts(self) -> DeviceBuffer:
        """Per row, the pool row of its own cache's entry 0."""
        if self._starts is None:
            self._starts = self.u32(("cache_starts",), self.caches.base)
        return self._starts

    def visible(self, window: int) -> DeviceBuffer:
        """Which of its cache's keys each row sees (committed ones within the window, and its
        ancestors in the pass), [rows, caches.n_keys]."""
        if window not in self._visible:
            self._visible[window] = self.u32(("visible", window), self.caches.mask(self.rows, window))
        return self._visible[window]

    def cache_rows(self, layer: int, width: int) -> tuple[DeviceBuffer, DeviceBuffer]:
        """The layer's keys and values on the device (the pool of the sequences' caches)."""
        pool = self.model.kv_mirrors
        kbuf, vbuf = pool.k[layer], pool.v[layer]
        self.kv_layers[layer] = (kbuf, vbuf, width)
        return kbuf, vbuf

    # ---- after the pass ------------------------------------------------------------------------
    def read(self, node: Node) -> np.ndarray:
        shape = (self.count(node), self.width(node))
        return self.out[node.id].read(F32, shape[0] * shape[1]).reshape(shape)

    def new_kv(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Each layer's keys and values of the pass's rows as the device stored them (f16), written into
        each sequence's host KVCache at its slots length + k (in place, as the CPU step) and returned
        as copies."""
        n = self.n_rows["T"]
        result = {}
        for layer, (kbuf, vbuf, width) in self.kv_layers.items():
            k, v = np.zeros((n, width), np.float16), np.zeros((n, width), np.float16)
            for mine, first in self.caches.stored_ranges():  # a sequence's rows lie end to end
                words, offset = len(mine) * width // 2, first * width * 2
                k[mine] = kbuf.read(np.uint32, words, offset).view(np.float16).reshape(len(mine), width)
                v[mine] = vbuf.read(np.uint32, words, offset).view(np.float16).reshape(len(mine), width)
            result[layer] = (k, v)
        self.caches.write_back(result)
        return result
