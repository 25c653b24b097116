"""The contract between the runtime and a device: what a runner does, and what opening one is told.

Owns: the `Runner` protocol every device's runner meets (the reference interpreter, the CPU's
compiled step and its op-by-op fallback, the CUDA and Vulkan runtimes), `RunnerOptions`, the
settings a device's `open_runner` receives, and `Capabilities`, the part of what a device can do
that code outside it reads (each device may extend it with its own facts). Does not own the list
of devices, how to open each or when `--device auto` picks one (kinetic/devices.py, the one
registry), nor what a pass computes.

A runner runs passes of the graph it was opened for. `run(graph, rows, kv)` computes one pass of
rows (kinetic/ir/rows.py: PassRows) over the caches the KVView gives and returns the named outputs
and, per layer, the keys and values of every row. `in_place` says where those keys and values went:
False, nowhere yet (the runtime commits what PassResult returns); True, already into each
sequence's cache at slots length + i (the runtime then commits by length: commit_written,
keep_written). `close()` frees what the runner holds on its device. Which graphs a device cannot
run, and why, is asked of the device before a runner exists (devices.Device.unsupported).

Exactness: every runner gives the reference interpreter's floats bit for bit, for any grouping of
rows into passes (docs/numerics.md); tests/device_checks.py holds the shared checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kinetic.codegen.cpu.matmul_choice import MatmulChoice
    from kinetic.ir.graph import Graph
    from kinetic.ir.ops import Op
    from kinetic.ir.rows import KVView, PassResult, PassRows
    from kinetic.passes.device_fusion import Fusions


class Runner(Protocol):
    """Runs passes of one graph on one device."""

    in_place: bool  # True: a pass's keys and values are written into the caches at slots length + i

    def run(self, graph: Graph, rows: PassRows, kv: KVView) -> PassResult:
        """One pass: the graph's outputs for rows.output_rows, and every row's keys and values."""

    def close(self) -> None:
        """Free what the runner holds on its device; it runs no pass after this."""


@dataclass(frozen=True)
class RunnerOptions:
    """What opening a runner is told: rows per prompt pass, CPU threads (None: every CPU), the
    context every sequence's cache holds, the most layers a GPU takes (None: as many as fit), and,
    for a device that leaves its first layers to the CPU, how to open a CPU runner for them (set by
    the registry: a device never imports another)."""

    batch: int
    threads: int | None
    n_ctx: int
    gpu_layers: int | None = None
    host_runner: Callable[[Graph], Runner] | None = None
    matmul: MatmulChoice | None = None  # the CPU's quantized matmul kernels (a .ktc profile's; same bits)


@dataclass(frozen=True)
class Capabilities:
    """What a device declares to the passes and the runtime, in one record: its name, the fused ops
    it has kernels for (a capability-gated rewrite produces an op only for a device that lists it),
    the most rows one pass may hold (None: any number; the device grows its buffers), the fusions its
    device phase makes (kinetic/passes/device_fusion.py; None: the device runs the generic graph)
    and the reduction orders its kernels sum in (kinetic/ir/orders.py; a graph asking another is
    refused), and the most sequences one pass may hold (`max_sequences`: 1 unless the device declares
    more, and then the runtime's scheduler runs one request at a time; None: any number, each row
    over its own sequence's cache)."""

    name: str
    fused_ops: frozenset[Op] = frozenset()
    max_rows: int | None = None
    fusions: Fusions | None = None
    reduction_orders: frozenset[str] = frozenset()
    max_sequences: int | None = 1
    # the numerics modes (kinetic/ir/orders.py NUMERICS) whose orders its kernels follow or refuse node
    # by node; a model asking for another runs in "ggml" (kinetic/numerics_mode.py)
    numerics: frozenset[str] = frozenset({"ggml"})
