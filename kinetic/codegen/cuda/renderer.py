"""The CUDA renderer: one table from op to the kernels a node of it launches, and what CUDA fuses.

Owns: `FUSIONS`, what CUDA declares to the device phase (kinetic/passes/device_fusion.py: a
residual add with the next norm, a layer's query and key rotations, one quantization of a row for
every matmul that reads it, and norms, SwiGLU / GEGLU and attention writing that row in their own
launch), `CAPABILITIES` (kinetic/codegen/runner.py's record: those forms and the generic fused ops
its table has rows for), `REDUCTION_ORDERS`, the orders its kernels sum in, and `KERNELS`, one
render function per op it runs, fused forms included. A graph it cannot run is one whose op is not
in the table, or whose node the table's function refuses with the reason (NotImplementedError).
Does not own the fusions' rules (the device phase makes them, and `lower` runs it), scheduling the kernels, buffers or
launches (the runtime, model.py and plan.py), or compiling (nvrtc.py).

A node's kernels are all its launch runs: a fused node's launch computes the values its inputs name
(an add_rms_norm's add, a rope_pair's other rotation; device_fusion.computed_by), which then have no
kernels of their own, and a producer an in-producer quantize reads renders the variant that also
writes the quantized row. A layer's key and value stores are one launch of its attention node.

One renderer serves every listed architecture: the kernels are plain CUDA C without architecture-
specific instructions (dp4a exists on all of them), so the same text compiles for each; what differs
per architecture is only what the capability table (caps.py) allows, which tests check every kernel
against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kinetic.codegen.cuda import (
    attention,
    concat,
    embed,
    gather,
    gemv,
    layer_norm,
    moe,
    pointwise,
    quantize,
    recurrent,
    recurrent_scan,
)
from kinetic.codegen.cuda.caps import ARCHS, BUDGETS, Arch, Budget
from kinetic.codegen.cuda.kernel import Kernel
from kinetic.codegen.runner import Capabilities
from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import REDUCE, Op, is_ggml_order, reduction_order
from kinetic.passes.device_fusion import Fusions, computed_by, quantized_in_producer
from kinetic.passes.pipeline import lower_for_device

_ROW_FORMATS = ("q8_0", "q8_1")  # blocks of 32: any launch that writes whole rows of 32-value blocks
FUSIONS = Fusions(
    quantized_matmuls=gemv.SUPPORTED,
    add_rms_norm=True,
    rope_pair=True,
    quantize_in=frozenset(
        {(op, fmt) for op in (Op.RMS_NORM, Op.ADD_RMS_NORM) for fmt in _ROW_FORMATS}
        # Q8_K (super-blocks of 256) where a 256-thread block holds one super-block: GLU rows of whole
        # super-blocks, attention over heads of 256
        | {(op, fmt) for op in (Op.SWIGLU, Op.GEGLU, Op.ATTENTION) for fmt in (*_ROW_FORMATS, "q8_k")}),
)
# every kernel sums in its reference's order (kinetic/ir/orders.py): the GEMVs in ggml's lane or block
# order of their weight type (F16: its 64 lanes, BF16: vdpbf16ps's pairs), RMS norm in float64,
# attention in one chain over the keys of an f16 cache
REDUCTION_ORDERS = frozenset({"lanes8", "block_chain", "lanes64", "bf16_pairs", "f64_sum", "key_chain_f16",
                              "mean_var_f64"})
# what CUDA declares to the passes and the runtime: its device forms and the generic fused ops (the
# table's rows, which a test keeps in step), passes of any number of rows and of any number of
# sequences (Convoy: each row attends over its own cache in the pool, common/kv_mirror.py), its
# fusions and orders
CAPABILITIES = Capabilities("cuda", fused_ops=FUSIONS.forms() | {Op.SWIGLU, Op.GEGLU}, max_rows=None,
                            fusions=FUSIONS, reduction_orders=REDUCTION_ORDERS, max_sequences=None)
# rows of the KV cache an attention mask row spans when the runtime does not say (render a graph alone)
DEFAULT_MASK_STRIDE = 4096


@dataclass
class Rendering:
    """A graph's kernels: per node id the kernels it runs, in order, and the nodes not covered yet."""

    kernels: dict[int, list[Kernel]] = field(default_factory=dict)
    unsupported: dict[int, str] = field(default_factory=dict)  # node id -> why

    def distinct(self) -> list[Kernel]:
        seen: dict[str, Kernel] = {}
        for ks in self.kernels.values():
            for k in ks:
                seen.setdefault(k.name, k)
        return list(seen.values())


@dataclass(frozen=True)
class Context:
    """What a render function reads besides its node: the graph, the attention mask stride (the
    runtime's KV cache capacity, a literal of every attention kernel) and, per producer, the format
    of the quantized row its launch also writes."""

    graph: Graph
    mask_stride: int
    quantized: dict[int, str]

    def width(self, node: Node) -> int:
        return int(node.type.shape[-1])


# ---- the table ----------------------------------------------------------------------------------

def _no_kernel(node: Node, ctx: Context) -> list[Kernel]:  # leaves: the runtime binds them
    return []


def _embed(node: Node, ctx: Context) -> list[Kernel]:
    """The lookup kernel of the table's type; none for a type without one, nor for a lookup by another
    input than the tokens (an encoder's positions, token types): the host dequantizes the pass's rows
    into its staging (common/host_lookup.py, plan.py)."""
    table = ctx.graph.node(node.inputs[0]).type.ggml_type
    by_tokens = ctx.graph.node(node.inputs[1]).attrs.name == "tokens"
    return [embed.embed(table, ctx.width(node))] if table in embed.SUPPORTED and by_tokens else []


def _take_rows(node: Node, ctx: Context) -> list[Kernel]:
    return [gather.take_rows(ctx.width(node))]


def _columns(node: Node, ctx: Context) -> list[Kernel]:
    return [gather.columns(ctx.width(ctx.graph.node(node.inputs[0])), node.attrs.start, node.attrs.count)]


def _matmul(node: Node, ctx: Context) -> list[Kernel]:
    """The GEMV for one row and the row-tiled GEMM for more (the runtime picks), reading the rows a
    quantize node made (float weights: the f32 rows, which their kernels round themselves)."""
    rows, weight = (ctx.graph.node(i) for i in node.inputs)
    wtype = weight.type.ggml_type
    if node.attrs.activations != "q8":
        raise NotImplementedError("float-activation matmuls (activations=f32)")
    if wtype not in gemv.ALL:
        raise NotImplementedError(f"{wtype.name} weights")
    if wtype in gemv.SUPPORTED and rows.op is not Op.QUANTIZE:
        raise NotImplementedError("a matmul of rows no quantize node made (the device phase makes them)")
    n_out, k = weight.type.shape
    return [gemv.gemv(wtype, n_out, k), gemv.gemm(wtype, n_out, k)]


def _quantize(node: Node, ctx: Context) -> list[Kernel]:
    """The quantizer; none where the producer's launch writes the row (in_producer)."""
    fmt = node.attrs.format
    if node.attrs.in_producer:
        producer = ctx.graph.node(node.inputs[0])
        if (producer.op, fmt) not in FUSIONS.quantize_in:
            raise NotImplementedError(f"a {producer.op.value} launch writing {fmt} rows")
        return []
    return [quantize.quantize(fmt, ctx.width(node))]


def _rms_norm(node: Node, ctx: Context) -> list[Kernel]:
    a = node.attrs
    return [pointwise.rms_norm(ctx.width(node), a.eps, a.group, weighted=len(node.inputs) == 2,
                               quantize=ctx.quantized.get(node.id))]


def _add_rms_norm(node: Node, ctx: Context) -> list[Kernel]:
    """The add of input 0 and the norm of its sum in one launch (which runs where the add stands)."""
    if ctx.graph.node(node.inputs[0]).op is not Op.ADD:
        raise NotImplementedError("add_rms_norm of a value no add computes")
    a = node.attrs
    return [pointwise.rms_norm(ctx.width(node), a.eps, a.group, weighted=len(node.inputs) == 2, residual=True,
                               quantize=ctx.quantized.get(node.id))]


def _rope(node: Node, ctx: Context) -> list[Kernel]:
    a = node.attrs
    return [pointwise.rope(a.n_head, a.head_dim, a.n_rot, a.neox)]


def _rope_pair(node: Node, ctx: Context) -> list[Kernel]:
    """The other rotation (input 2) and this one in one launch: the same positions and tables."""
    a, other = node.attrs, ctx.graph.node(node.inputs[2])
    if (other.op is not Op.ROPE or other.inputs[1] != node.inputs[1]
            or replace(other.attrs, n_head=0) != replace(a, n_head=0)):
        raise NotImplementedError("a rope_pair whose other rotation is not a rope of the same positions and tables")
    return [pointwise.rope(other.attrs.n_head, a.head_dim, a.n_rot, a.neox, n_head_b=a.n_head)]


def _attention(node: Node, ctx: Context) -> list[Kernel]:
    """The pass's new keys and values go into the cache (one launch for both), then the rows attend
    over it: one warp per (row, head), or 8 with the keys' work in parallel (the runtime picks). With
    a quantized row: the parallel kernel writes it, and the quantizer follows the one-warp kernel."""
    a = node.attrs
    if a.kv_dtype != "f16":
        raise NotImplementedError(f"a {a.kv_dtype} KV cache")
    fmt = ctx.quantized.get(node.id)
    shape = (a.n_head, a.n_kv_head, a.head_dim, a.scale, a.softcap)
    kernels = [gather.kv_store(a.n_kv_head * a.head_dim, pair=True),
               attention.attention(*shape, mask_stride=ctx.mask_stride),
               attention.attention_rows(*shape, mask_stride=ctx.mask_stride, quantize=fmt)]
    return kernels + ([quantize.quantize(fmt, ctx.width(node))] if fmt else [])


def _elementwise(name: str) -> Callable[[Node, Context], list[Kernel]]:
    def render(node: Node, ctx: Context) -> list[Kernel]:
        if any(ctx.graph.node(i).type.shape != node.type.shape for i in node.inputs):
            raise NotImplementedError("operands of different shapes (a broadcast)")
        factor = node.attrs.factor if node.op is Op.SCALE else node.attrs.cap if node.op is Op.SOFTCAP else 1.0
        return [pointwise.elementwise(name, ctx.width(node), factor, quantize=ctx.quantized.get(node.id))]

    return render


def _add_bias(node: Node, ctx: Context) -> list[Kernel]:
    return [pointwise.elementwise("add_bias", ctx.width(node))]


Render = Callable[[Node, Context], list[Kernel]]
KERNELS: dict[Op, Render] = {
    Op.INPUT: _no_kernel, Op.PARAM: _no_kernel, Op.STATE: _no_kernel, Op.RECURRENT_STATE: _no_kernel,
    Op.EMBED: _embed,
    Op.MATMUL: _matmul,
    Op.QUANTIZE: _quantize,
    Op.TAKE_ROWS: _take_rows,
    Op.COLUMNS: _columns,
    Op.CONCAT: lambda node, ctx: [concat.concat(*(ctx.width(ctx.graph.node(i)) for i in node.inputs))],
    Op.RMS_NORM: _rms_norm,
    Op.LAYER_NORM: lambda node, ctx: [layer_norm.layer_norm(ctx.width(node), node.attrs.eps,
                                                            weighted=len(node.inputs) == 2)],
    Op.ADD_RMS_NORM: _add_rms_norm,
    Op.ROPE: _rope,
    Op.ROPE_PAIR: _rope_pair,
    Op.ATTENTION: _attention,
    Op.ADD_BIAS: _add_bias,
    # recurrent layers (recurrent.py; each row's state staged and read back: model.py, pass_states.py):
    # the short convolution, Mamba-2's scan, Gated DeltaNet's delta rule and qwen35's stateless ops
    Op.SHORT_CONV: lambda node, ctx: [recurrent.short_conv(ctx.width(node), int(ctx.graph.node(node.inputs[1])
                                                                                .type.shape[1]))],
    Op.SSM_SCAN: lambda node, ctx: [recurrent_scan.ssm_scan(node.attrs.n_head, node.attrs.head_dim,
                                                            node.attrs.n_group, node.attrs.d_state)],
    Op.DELTA_RULE: lambda node, ctx: [recurrent_scan.delta_rule(node.attrs.n_k_head, node.attrs.n_v_head,
                                                                node.attrs.head_dim)],
    Op.SIGMOID: lambda node, ctx: [recurrent.sigmoid(ctx.width(node))],
    Op.HEAD_COLUMNS: lambda node, ctx: [recurrent.head_columns(node.attrs.n_head, node.attrs.stride,
                                                               node.attrs.start, node.attrs.count)],
    # mixture of experts: routing on the device, each slot a GEMV of its expert (moe.py)
    **{op: lambda node, ctx: moe.render(node, ctx.graph) for op in moe.OPS},
    **{op: _elementwise(op.value) for op in (Op.ADD, Op.MUL, Op.SCALE, Op.SILU, Op.GELU, Op.SWIGLU, Op.GEGLU,
                                                    Op.SOFTCAP)},
}


class CudaRenderer:
    """`mask_stride`: the keys each row of an attention mask holds, which is the runtime's KV cache
    capacity; it is a literal of every attention kernel's text."""

    archs: dict[str, Arch] = ARCHS
    budgets: dict[str, Budget] = BUDGETS
    fusions: Fusions = FUSIONS

    def __init__(self, *, mask_stride: int = DEFAULT_MASK_STRIDE):
        self.mask_stride = mask_stride

    def lower(self, graph: Graph, keep: frozenset[int] = frozenset()) -> Graph:
        """The graph CUDA runs: `graph` after the device phase with CUDA's fusions (ids kept; `keep`
        are a split's first layers, run elsewhere and left as they are)."""
        return lower_for_device(graph, FUSIONS, keep=keep)

    def context(self, graph: Graph) -> Context:
        quantized = {pid: q.attrs.format for pid, q in quantized_in_producer(graph).items()}
        return Context(graph, self.mask_stride, quantized)

    def node_kernels(self, node: Node, graph: Graph) -> list[Kernel]:
        """The kernels one node of a lowered graph launches; NotImplementedError saying what is missing."""
        return self._kernels(node, self.context(graph))

    def render(self, graph: Graph, skip: frozenset[int] = frozenset()) -> Rendering:
        """Every node's kernels of a lowered graph but those in `skip` (a split's first layers, which
        run elsewhere); a node another launch computes has none."""
        out, ctx = Rendering(), self.context(graph)
        by_launch = computed_by(graph)
        for node in graph.nodes:
            if node.id in skip:
                continue
            try:
                out.kernels[node.id] = [] if node.id in by_launch else self._kernels(node, ctx)
            except (NotImplementedError, ValueError) as e:
                out.unsupported[node.id] = f"{node.op.value}: {e}"
        return out

    def _kernels(self, node: Node, ctx: Context) -> list[Kernel]:
        render = KERNELS.get(node.op)
        if render is None:
            raise NotImplementedError(f"no CUDA kernel for op {node.op.value}")
        kernels = render(node, ctx)
        if node.op in REDUCE:  # the batch-invariance contract: follow the node's order, or refuse it
            order = reduction_order(node.op, [ctx.graph.node(i).type for i in node.inputs], node.attrs)
            follows = CAPABILITIES.reduction_orders
            if order not in follows:
                raise NotImplementedError(f"reduction order {order!r} (CUDA's kernels follow "
                                          f"{', '.join(sorted(follows))})")
            if not is_ggml_order(node.op, [ctx.graph.node(i).type for i in node.inputs], node.attrs):
                raise NotImplementedError(f"reduction order {order!r} of the fast numerics mode (CUDA's kernels "
                                          "follow the ggml mode's orders; run with --numerics ggml)")
        return kernels
