"""A whole model's passes through the generated CUDA kernels: weights on the device, the KV cache on
the device, each pass shape recorded once and replayed (a CUDA graph on a GPU).

Owns: lowering the graph it is given to the graph CUDA runs (the device phase with CUDA's fusions,
renderer.CudaRenderer.lower), checking once that every op and weight of it has a CUDA kernel
(refusing with the reason otherwise), choosing the backend (a GPU for `--device cuda`, the host emulation for `--device
cuda-emulated`) and how many layers fit there (the first ones run on the CPU runner the registry
hands in: `SplitModel`), uploading the weights once, and per pass shape a `Plan` (plan.py: its
launches, buffers and staging) recorded once and replayed: on a GPU one host-to-device copy, one
graph launch, one copy back. Does not own the kernels (renderer.py and the kernel modules), the
device calls (backends.py), the device copies of the sequences' caches (common/kv_mirror.py), where
each row of a pass reads and writes them (common/pass_caches.py), the recurrent states a pass stages
and reads back (pass_states.py: the runtime keeps them, as for the CPU) or the cache's bookkeeping (the
runtime's KVCache: length, positions, rollback).

The KV cache: each sequence's cache gets, on first use, a slot in the device's pool of caches (per
layer one buffer of keys and one of values, n_ctx f16 rows per slot), kept in step by the
`host_writes` protocol (common/kv_mirror.py). A pass may hold the rows of several sequences
(Convoy): each row's key and value are stored (rounded to f16) at its own cache's slots length + k,
each row attends over its own cache only (kv_rows: its cache's first pool row; its mask: its own
cache's keys), and the rows come back in one copy (the keys' and values' f32 rows sit side by side
in one buffer; the host rounds them to f16 exactly as the device did) and are written into each
sequence's host cache in place (`in_place`, as the CPU step). Recordings do not depend on which
sequences a pass holds; the pool growing (more caches alive at once) drops them.

Exactness: every kernel computes its reference's value bit for bit (RMS norm: see pointwise.py), and
a row's result never depends on the other rows of its launch, so a pass here equals the reference
interpreter's, and a batch equals its rows alone. CI runs this module whole on the host emulation
(backends.HostBackend) against the reference on both real models.
"""

from __future__ import annotations

import atexit
import sys
from collections import OrderedDict

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.common.host_lookup import host_lookups, read_on_device
from kinetic.codegen.common.kv_mirror import KVMirrors
from kinetic.codegen.common.pass_caches import PassCaches
from kinetic.codegen.common.tables import RopeTables
from kinetic.codegen.cuda import experts, pass_states
from kinetic.codegen.cuda.embed import SUPPORTED as LOOKUP_TYPES
from kinetic.codegen.cuda.launch_order import LaunchOrder
from kinetic.codegen.cuda.plan import ATTENTION_SCRATCH_BYTES, Plan
from kinetic.codegen.cuda.renderer import CudaRenderer
from kinetic.codegen.runner import Runner, RunnerOptions
from kinetic.errors import KineticError
from kinetic.ir import numerics
from kinetic.ir.graph import Graph
from kinetic.ir.interpreter import WeightSource
from kinetic.ir.ops import Op
from kinetic.ir.rows import KVView, PassResult, PassRows
from kinetic.passes.split import LayerSplit, layer_of_nodes, n_layers, split_layers

F32 = np.float32
MAX_PLANS = 8  # pass shapes whose buffers are kept (decode, verification passes, prompt chunks)


def unsupported(graph: Graph) -> str | None:
    """Why this graph cannot run on CUDA (the first node of its lowered form without a kernel, and
    why), or None."""
    renderer = CudaRenderer()
    return next(iter(renderer.render(renderer.lower(graph)).unsupported.values()), None)


def open_runner(graph: Graph, weights: WeightSource, options: RunnerOptions, *, emulated: bool = False):
    """The runner for `--device cuda` (`cuda-emulated`: the same runtime on the host emulation of the
    kernels): this graph's weights on the current GPU, or, for a model larger than the GPU or
    --gpu-layers N below its layer count, its last layers there and the first ones on the CPU
    (`options.host_runner(head_graph)` opens that runner). No usable GPU, an op or weight type without
    a kernel, or a model whose every layer would not fit is a KineticError with the reason; a split is
    one line on stderr."""
    from kinetic.codegen.cuda import emulator
    from kinetic.codegen.cuda.backends import GpuBackend, HostBackend
    from kinetic.codegen.cuda.device import unavailable_reason

    name = "cuda-emulated" if emulated else "cuda"
    n_ctx, gpu_layers, cpu_runner = options.n_ctx, options.gpu_layers, options.host_runner
    reason = unsupported(graph)
    if reason:
        raise KineticError(f"--device {name} cannot run this model: {reason}", "Use --device cpu.")
    reason = emulator.unavailable_reason() if emulated else unavailable_reason()
    if reason:
        raise KineticError(f"--device {name} cannot run here: {reason}", "Use --device cpu.")
    if gpu_layers is not None and gpu_layers <= 0:
        raise KineticError(f"--gpu-layers {gpu_layers} puts no layer on the GPU", "Use --device cpu.")
    if emulated:
        print("kinetic: --device cuda-emulated is running on the host emulation of its kernels (exact, "
              "but far slower than --device cpu)", file=sys.stderr)
    backend = HostBackend() if emulated else GpuBackend()
    total = n_layers(graph)
    free = backend.free_bytes()
    on_gpu = min(gpu_layers or total, total)
    fit = layers_that_fit(graph, weights, n_ctx, free) if free is not None else total
    expert_cache = flywheel_cache(graph, weights, n_ctx, free) if free is not None and gpu_layers is None else None
    if expert_cache is not None:  # Flywheel: every layer on the GPU, the experts that fit in its cache
        fit = total
    if fit < on_gpu:  # at most N layers: as many of the last ones as fit
        if fit == 0:
            raise KineticError(f"not even one layer of this model and its {n_ctx}-token cache fits in the "
                               f"{free / 2**30:.1f} GiB free on {backend.name}",
                               "Use a smaller context (-c N) or --device cpu.")
        on_gpu = fit
    model: CudaModel | SplitModel
    if on_gpu == total:
        model = CudaModel(graph, weights, backend, n_ctx, expert_cache=expert_cache)
        if model.experts is not None:
            print(f"kinetic: {model.experts.status()}", file=sys.stderr)
    else:
        if cpu_runner is None:
            raise KineticError(f"only {on_gpu} of {total} layers fit on {backend.name}", "Use --device cpu.")
        split = split_layers(graph, total - on_gpu)
        model = SplitModel(cpu_runner(split.head), CudaModel(graph, weights, backend, n_ctx, split=split), split)
        print(f"kinetic: {on_gpu} of {total} layers on {backend.name}, the rest on the CPU", file=sys.stderr)
    atexit.register(model.close)
    return model


def layer_bytes(graph: Graph, weights: WeightSource, n_ctx: int) -> tuple[int, dict[int, int], int]:
    """Device bytes outside the layers (output layer, final norm; the embedding table when the output
    layer reads it), per layer (its weights and one sequence's f16 cache), and of what only the
    embedding lookup reads (an untied table: on the device only when every layer is, and only with a
    CUDA lookup kernel for its type; the host looks the other types up)."""
    top = layer_of_nodes(graph)
    users = graph.users()
    on_device = read_on_device(graph, host_lookups(graph, weights, LOOKUP_TYPES))
    fixed, per_layer, lookup = 0, dict.fromkeys(range(n_layers(graph)), 0), 0
    for node in graph.nodes:
        if node.op is Op.PARAM and node.id in on_device:
            raw = weights.tensor(node.attrs.tensor)
            nbytes = raw.size * 4 if node.type.ggml_type is Q.F32 else raw.nbytes
            if top[node.id] >= 0:
                per_layer[top[node.id]] += nbytes
            elif any(top[u] >= 0 or graph.node(u).op is not Op.EMBED for u in users[node.id]):
                fixed += nbytes  # read after the layers (a tied output layer reads the embedding table)
            else:
                lookup += nbytes
        elif node.op is Op.ATTENTION:
            per_layer[top[node.id]] += 2 * n_ctx * node.attrs.n_kv_head * node.attrs.head_dim * 2
    return fixed, per_layer, lookup


def flywheel_cache(graph: Graph, weights: WeightSource, n_ctx: int, free: int) -> int | None:
    """The bytes of Flywheel's expert cache (docs/moe.md) for a MoE model whose experts do not all fit
    in `free` bytes but whose other weights and cache do (with the activations' room kept, as
    layers_that_fit does); None otherwise (no experts, all fit, or not even the rest fits)."""
    stacks = experts.stacks_bytes(graph, weights)
    if not stacks:
        return None
    fixed, per_layer, lookup = layer_bytes(graph, weights, n_ctx)
    room = free - max(256 << 20, free // 20)
    everything = fixed + sum(per_layer.values()) + lookup
    if everything <= room or everything - stacks > room:
        return None
    return room - (everything - stacks)


def free_bytes_for_experts(graph: Graph, weights: WeightSource, n_ctx: int, *, cached: int) -> int:
    """The free device bytes (KINETIC_GPU_BYTES) at which flywheel_cache leaves room for `cached`
    experts: everything but the experts, that many cache slots and the activations' 256 MiB (its
    inverse while that stays under 5 GiB, where the activations' room is 256 MiB)."""
    _, _, slot = experts.slot_layout(CudaRenderer().lower(graph), weights)
    fixed, per_layer, lookup = layer_bytes(graph, weights, n_ctx)
    rest = fixed + sum(per_layer.values()) + lookup - experts.stacks_bytes(graph, weights)
    return rest + cached * slot + (256 << 20)


def layers_that_fit(graph: Graph, weights: WeightSource, n_ctx: int, free: int) -> int:
    """How many of the last layers fit in `free` bytes with what runs after them, leaving room for
    the activations (a twentieth of the memory, at least 256 MiB); all of them only if the embedding
    table fits beside them too (with a layer on the CPU, the lookup runs there)."""
    fixed, per_layer, lookup = layer_bytes(graph, weights, n_ctx)
    room = free - max(256 << 20, free // 20) - fixed
    count = 0
    for layer in sorted(per_layer, reverse=True):
        room -= per_layer[layer]
        if room < 0:
            break
        count += 1
    if count == len(per_layer) and room < lookup:
        count -= 1
    return count


class SplitModel:
    """A model's first layers on the CPU and the rest on the GPU: per pass the CPU runs the head graph
    (writing its layers' cache rows in place), then the GPU runs the rest from the hidden state."""

    in_place = True

    def __init__(self, cpu: Runner, gpu: CudaModel, split: LayerSplit):
        if not cpu.in_place:
            raise ValueError("the CPU part of a split must write its cache rows in place")
        self.cpu, self.gpu, self.split = cpu, gpu, split

    def run(self, graph: Graph, rows: PassRows, kv: KVView) -> PassResult:
        head = self.cpu.run(self.split.head, rows, kv)
        result = self.gpu.run(graph, rows, kv, hidden=head.outputs["hidden"])
        result.new_state.update(head.new_state)  # the first layers' recurrent states
        return result

    def close(self) -> None:
        self.cpu.close()
        self.gpu.close()


class CudaModel:
    """Runs passes of one graph on one backend; the runner for `--device cuda` and `cuda-emulated`."""

    in_place = True  # the pass's new cache rows are written into the host KVCache at slots length + i
    attention_scratch_bytes = ATTENTION_SCRATCH_BYTES  # passes within it attend with attention_rows

    def __init__(self, graph: Graph, weights: WeightSource, backend, n_ctx: int, split: LayerSplit | None = None,
                 expert_cache: int | None = None):
        self.source, self.backend, self.n_ctx, self.split = graph, backend, int(n_ctx), split
        # with a split, the first layers' nodes run elsewhere: their crossing value comes in as "hidden"
        self.skip = split.head_ids if split else frozenset()
        renderer = CudaRenderer(mask_stride=self.n_ctx)
        self.graph = graph = renderer.lower(graph, keep=self.skip)  # the device phase: ids kept
        rendering = renderer.render(graph, self.skip)
        if rendering.unsupported:
            reason = next(iter(rendering.unsupported.values()))
            raise KineticError(f"this model cannot run on CUDA: {reason}", "Use --device cpu.")
        self._kernels = rendering.kernels
        self.order = LaunchOrder.of(graph, self._kernels, self.skip)  # what every pass shape's plan shares
        # Flywheel (expert_cache bytes): the experts stay in host memory, a cache of them on the device
        self.experts = (experts.ExpertOffload(graph, weights, backend, expert_cache, self._kernels)
                        if expert_cache is not None else None)
        backend.compile(list({k.name: k for ks in self._kernels.values() for k in ks}.values()))
        # lookups from tables without a CUDA kernel: the host stages their rows (plan.py); a table only
        # they read stays on the host
        self.host_lookups = host_lookups(graph, weights, LOOKUP_TYPES, self.skip)
        used = read_on_device(graph, self.host_lookups, self.skip)
        host_experts = experts.stack_ids(graph) if self.experts else frozenset()  # Flywheel's: copied up on demand
        self.weights: dict[str, object] = {}
        for node in graph.nodes:
            if node.op is Op.PARAM and node.id in used and node.id not in host_experts:
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
        self.recurrent = pass_states.state_shapes(graph, self.skip)  # name -> (rows, width)
        self._plans: OrderedDict[tuple[int, int], Plan] = OrderedDict()
        self._recordings: dict[tuple[int, int], object] = {}  # per plan, its launches recorded
        self.kv_mirrors = KVMirrors(alloc=backend.empty, write=lambda buf, at, rows: backend.write(buf[at:], rows),
                                    layers=sorted(self.kv_layers), on_grow=self._recordings.clear,
                                    device="the CUDA runner")
        self._rope: dict[numerics.Rotary, RopeTables] = {}
        tables = [graph.node(n.inputs[0]) for n in graph.nodes if n.op is Op.EMBED and n.id not in self.skip]
        self.vocab = int(tables[0].type.shape[0]) if tables else None  # rows the embedding lookup reads

    def rope_tables(self, key: numerics.Rotary) -> RopeTables:
        if key not in self._rope:
            self._rope[key] = RopeTables(key)
        return self._rope[key]

    # ---- plans and recordings --------------------------------------------------------------------
    def plan(self, n_rows: int, n_out: int) -> Plan:
        key = (n_rows, n_out)
        plan = self._plans.pop(key, None) or Plan(self, n_rows, n_out)
        self._plans[key] = plan
        while len(self._plans) > MAX_PLANS:
            old, _ = self._plans.popitem(last=False)
            self._recordings.pop(old, None)
        return plan

    def recording(self, plan: Plan):
        """The plan's launches over the pool of caches, recorded once (a CUDA graph on a GPU) and
        again after the pool grows."""
        key = (plan.n_rows, plan.n_out)
        if key not in self._recordings:
            pool = {"k": self.kv_mirrors.k, "v": self.kv_mirrors.v}
            launches = [(x.kernel, x.rows, tuple(pool[a[0]][a[1]] if isinstance(a, tuple) else a for a in x.args))
                        for x in plan.launches]
            self._recordings[key] = experts.record_with_host_steps(self.backend, launches)
        return self._recordings[key]

    # ---- one pass --------------------------------------------------------------------------------
    def run(self, graph: Graph, rows: PassRows, kv: KVView, hidden: np.ndarray | None = None) -> PassResult:
        """One pass of one or several sequences' rows, each over its own cache; with a split,
        `hidden` is the first layers' output for the pass's rows."""
        if graph is not self.source:
            raise ValueError("CudaModel runs the graph it was built for")
        n, r = len(rows.tokens), len(rows.output_rows)
        if self.vocab is not None and n and not (0 <= int(rows.tokens.min()) and int(rows.tokens.max()) < self.vocab):
            raise KineticError(f"a token id is outside the vocabulary (0..{self.vocab - 1})",
                               "Check the token ids of the prompt.")
        for seq in np.unique(rows.seqs):
            if kv.sequence(int(seq)).n_ctx != self.n_ctx:
                raise ValueError(f"a cache holds {kv.sequence(int(seq)).n_ctx} entries; this runner was built "
                                 f"for {self.n_ctx}")
        if (hidden is None) != (self.split is None):
            raise ValueError("a split runner takes the first layers' hidden state, and only a split one")
        caches = PassCaches.of(rows, kv, self.kv_mirrors)  # each row's cache in the pool, brought up to date
        plan = self.plan(n, r)
        plan.fill(rows, caches, hidden)
        pass_states.stage(plan, rows, kv)
        self.backend.write(plan.inputs, plan.staging[: plan.input_bytes])
        self.recording(plan)()
        outputs = {name: plan.read(self.graph.node(nid)) for name, nid in self.graph.outputs}
        return PassResult(outputs, plan.new_kv(caches), pass_states.read(plan, rows))

    def close(self) -> None:
        self._recordings.clear()
        self._plans.clear()
        self.kv_mirrors.close()
        self.weights, self.gelu = {}, None
        self.backend.close()
