"""Vulkan's op-to-kernel table: for every IR op the device runs, the function that records a node's
dispatches into a pass and the check that refuses a node its kernel does not cover.

Owns: `KERNELS` (Op -> OpKernel); `unsupported(graph)`: an op without a row, a node its row refuses,
or a reduction whose order (kinetic/ir/orders.py) is not among `REDUCTION_ORDERS`, each with the
reason (kinetic/codegen/common/orders.py checks the orders); and `CAPABILITIES`, what the passes and
the runtime read of Vulkan before a device is opened (kinetic/codegen/runner.py: Capabilities).
A row's `emit(p, node)` records the node through the pass recorder `p` (recorder.py: buffers,
grids, the per-pass tables) with the kernels VulkanOps renders (ops.py); most rows are
`computed(record)`, where `record(p, node, ins, out, n)` gets the node's inputs, its planned result
and its row count (a node with no rows records nothing). Does not own the kernels' arithmetic (the
renderer modules), buffers (recorder.py, planned by kinetic/codegen/common/buffers.py) or the
runner (model.py).

Adding an op: its spec and reference in kinetic/ir (docs/ir.md, "Adding an op"), a renderer here,
its key in ops.py, and one row below.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kinetic.codegen.common.orders import refused_order
from kinetic.codegen.runner import Capabilities
from kinetic.codegen.vulkan import concat, elementwise, gather, moe_records, recurrent, recurrent_records, rope
from kinetic.codegen.vulkan.dispatch import Dispatch
from kinetic.codegen.vulkan.ops import SUPPORTED_WEIGHTS
from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import Op


def _accepts(graph: Graph, node: Node) -> str | None:
    return None


@dataclass(frozen=True)
class OpKernel:
    """One row: `emit(p, node)` records the node (leaves: binds it); `refuse(graph, node)` says why the
    kernel cannot run this node (None: it can)."""

    emit: Callable
    refuse: Callable[[Graph, Node], str | None] = _accepts


def computed(record: Callable) -> Callable:
    """An emit for an op with a result: the planned result buffer, then `record(p, node, ins, out, n)`
    unless the node has no rows (a pass without output rows computes nothing past take_rows)."""

    def emit(p, node: Node) -> None:
        out = p.result(node)
        n = p.count(node)
        if n:
            record(p, node, [p.out.get(i) for i in node.inputs], out, n)

    return emit


# ---- leaves --------------------------------------------------------------------------------------

def bind_input(p, node: Node) -> None:
    """The pass's token ids, positions, token types or output rows, written by the host; a prediction
    block's trunk rows (`hidden.<width>`, f32) as their bits."""
    values = p.rows.input(node.attrs.name)
    if node.attrs.name.startswith("hidden."):
        values = np.ascontiguousarray(values, np.float32).view(np.uint32)
    p.out[node.id] = p.u32(("input", node.attrs.name), values)


def bind_nothing(p, node: Node) -> None:
    """Weights are read where uploaded (p.model.weights / parts); the cache through the mirror."""


# ---- lookups and projections ---------------------------------------------------------------------

def emit_embed(p, node: Node) -> None:
    """The lookup kernel of the table's type (record_embed); for a type without one, the rows the host
    dequantized (common/host_lookup.py)."""
    if node.id in p.model.host_lookups:
        p.out[node.id] = p.looked_up(node)
    else:
        computed(record_embed)(p, node)


def record_embed(p, node: Node, ins, out, n: int) -> None:
    """One lookup per part of the table: each part fills the rows whose ids it holds."""
    width = p.width(node)
    k = p.ops.embed_kernel(p.graph.node(node.inputs[0]).type.ggml_type, width)
    for first, count, table in p.model.parts[p.graph.node(node.inputs[0]).attrs.tensor]:
        p.dispatches.append(Dispatch(k, [table, ins[1], out], p.grid(-(-n * width // gather.WORKGROUP)),
                                     struct.pack("<3I", n, first, count)))


def refuse_matmul(graph: Graph, node: Node) -> str | None:
    if node.attrs.activations != "q8":
        return f"matmul with {node.attrs.activations} activations has no Vulkan kernel (only q8)"
    wtype = graph.node(node.inputs[1]).type.ggml_type
    return None if wtype in SUPPORTED_WEIGHTS else f"matmul with {wtype.name} weights has no Vulkan kernel"


def record_matmul(p, node: Node, ins, out, n: int) -> None:
    """One matmul per part of the weight (the activations quantized, then the matvec); parts after a
    split are put in their columns."""
    w, x = p.graph.node(node.inputs[1]), p.graph.node(node.inputs[0])
    k_in, n_out = p.width(x), p.width(node)
    parts = p.model.parts[w.attrs.tensor]
    for i, (first, count, wbuf) in enumerate(parts):
        y = out if len(parts) == 1 else p.value(("part", node.id, i), n * count * 4)
        p.dispatches += p.ops.matmul_dispatches(
            ins[0], y, wbuf, w.type.ggml_type, n, k_in, count,
            lambda slot, nbytes, i=i: p.value(("scratch", node.id, i, slot), nbytes))
        if len(parts) > 1:
            place = p.ops.place_columns_kernel(count, n_out)
            p.dispatches.append(Dispatch(place, [y, out], p.grid(-(-n * count // gather.WORKGROUP)),
                                         struct.pack("<2I", n, first)))


def record_take_rows(p, node: Node, ins, out, n: int) -> None:
    width = p.width(node)
    p.dispatch(p.ops.take_rows_kernel(width), [ins[0], ins[1], out], n * width, gather.WORKGROUP, n)


def record_columns(p, node: Node, ins, out, n: int) -> None:
    """A range of each row's values, copied."""
    width, a = p.width(p.graph.node(node.inputs[0])), node.attrs
    p.dispatch(p.ops.columns_kernel(width, a.start, a.count), [ins[0], out], n * a.count, gather.WORKGROUP, n)


# ---- normalization and position ------------------------------------------------------------------

def record_rms_norm(p, node: Node, ins, out, n: int) -> None:
    a, width = node.attrs, p.width(node)
    group = a.group or width
    weight = [p.model.weights[p.graph.node(node.inputs[1]).attrs.tensor]] if len(ins) == 2 else []
    wlen = p.width(p.graph.node(node.inputs[1])) if weight else 0
    k = p.ops.rms_norm_kernel(width, group, a.eps, wlen)
    p.dispatches.append(Dispatch(k, [ins[0], *weight, out], p.grid(n * (width // group))))


def record_layer_norm(p, node: Node, ins, out, n: int) -> None:
    """One workgroup per row (layer_norm.py); the bias is the add_bias after it."""
    weight = [p.model.weights[p.graph.node(node.inputs[1]).attrs.tensor]] if len(ins) == 2 else []
    k = p.ops.layer_norm_kernel(p.width(node), node.attrs.eps, bool(weight))
    p.dispatches.append(Dispatch(k, [ins[0], *weight, out], p.grid(n)))


def record_rope(p, node: Node, ins, out, n: int) -> None:
    a = node.attrs
    cos, sin = p.rope_tables(a.rotary)  # every scaling is in the tables (common/tables.py)
    k = p.ops.rope_kernel(a.n_head, a.head_dim, a.n_rot, a.neox)
    p.dispatch(k, [ins[0], cos, sin, out], n * a.n_head * (a.head_dim // 2), rope.WORKGROUP, n)


# ---- attention over the KV cache -----------------------------------------------------------------

def refuse_attention(graph: Graph, node: Node) -> str | None:
    a = node.attrs
    if a.kv_dtype != "f16" or a.softcap or a.head_dim % 64:
        return "attention needs an f16 cache, no soft-capping and heads of 64k values on Vulkan"
    return None


def record_attention(p, node: Node, ins, out, n: int) -> None:
    """Store the pass's keys and values after the committed ones of each row's own cache (in the
    device's pool of caches), then attend, each row over its own cache."""
    a = node.attrs
    layer = p.graph.node(node.inputs[3]).attrs.layer
    width = a.n_kv_head * a.head_dim
    kbuf, vbuf = p.cache_rows(layer, width)
    slots = p.slots()
    store = p.ops.kv_store_kernel(width)
    p.dispatch(store, [ins[1], slots, kbuf], n * width // 2, gather.WORKGROUP, n)
    p.dispatch(store, [ins[2], slots, vbuf], n * width // 2, gather.WORKGROUP, n)
    kernel = p.ops.attention_kernel(a)
    bindings = [ins[0], kbuf, vbuf, p.visible(a.window), p.cache_starts(), p.ops.expf_table(), out]
    p.dispatches.append(Dispatch(kernel, bindings, p.grid(n * a.n_head), struct.pack("<I", p.caches.n_keys)))


# ---- elementwise ---------------------------------------------------------------------------------

def record_elementwise(name: str) -> Callable:
    """One invocation per element; gelu and geglu also read ggml's f16 table."""

    def record(p, node: Node, ins, out, n: int) -> None:
        factor = node.attrs.factor if name == "scale" else node.attrs.cap if name == "softcap" else 1.0
        table = [p.gelu_table()] if name in ("gelu", "geglu") else []
        size = n * p.width(node)
        p.dispatch(p.ops.elementwise_kernel(name, factor), [*ins, *table, out], size, elementwise.WORKGROUP, size)

    return record


def record_sigmoid(p, node: Node, ins, out, n: int) -> None:
    """1 / (1 + expf(-x)) per value, glibc's expf (recurrent.py)."""
    size = n * p.width(node)
    p.dispatch(p.ops.kernel(("sigmoid",), recurrent.render_sigmoid), [ins[0], p.ops.expf_table(), out], size,
               recurrent.WORKGROUP, size)


def record_head_columns(p, node: Node, ins, out, n: int) -> None:
    """Each head's slice of an interleaved projection, copied (recurrent.py)."""
    a = node.attrs
    k = p.ops.kernel(("head_columns", a.n_head, a.stride, a.start, a.count),
                     lambda: recurrent.render_head_columns(a.n_head, a.stride, a.start, a.count))
    p.dispatch(k, [ins[0], out], n * p.width(node), recurrent.WORKGROUP, n)


def record_add_bias(p, node: Node, ins, out, n: int) -> None:
    """x plus the bias (an f32 weight, uploaded once) on every row."""
    bias, size = p.model.weights[p.graph.node(node.inputs[1]).attrs.tensor], n * p.width(node)
    p.dispatch(p.ops.add_bias_kernel(p.width(node)), [ins[0], bias, out], size, elementwise.WORKGROUP, size)


KERNELS: dict[Op, OpKernel] = {
    Op.INPUT: OpKernel(bind_input),
    Op.PARAM: OpKernel(bind_nothing),
    Op.STATE: OpKernel(bind_nothing),
    Op.EMBED: OpKernel(emit_embed),
    Op.MATMUL: OpKernel(computed(record_matmul), refuse_matmul),
    Op.TAKE_ROWS: OpKernel(computed(record_take_rows)),
    Op.COLUMNS: OpKernel(computed(record_columns)),
    Op.CONCAT: OpKernel(computed(concat.record_concat)),
    Op.RMS_NORM: OpKernel(computed(record_rms_norm)),
    Op.LAYER_NORM: OpKernel(computed(record_layer_norm)),
    Op.ROPE: OpKernel(computed(record_rope)),
    Op.ATTENTION: OpKernel(computed(record_attention), refuse_attention),
    Op.ADD: OpKernel(computed(record_elementwise("add"))),
    Op.ADD_BIAS: OpKernel(computed(record_add_bias)),
    Op.MUL: OpKernel(computed(record_elementwise("mul"))),
    Op.SCALE: OpKernel(computed(record_elementwise("scale"))),
    Op.SILU: OpKernel(computed(record_elementwise("silu"))),
    Op.GELU: OpKernel(computed(record_elementwise("gelu"))),
    Op.SWIGLU: OpKernel(computed(record_elementwise("swiglu"))),
    Op.GEGLU: OpKernel(computed(record_elementwise("geglu"))),
    Op.SOFTCAP: OpKernel(computed(record_elementwise("softcap"))),
    Op.SIGMOID: OpKernel(computed(record_sigmoid)),
    Op.HEAD_COLUMNS: OpKernel(computed(record_head_columns)),
    # the recurrent state: a leaf its op reads through the pass's walk buffer (pass_states.py); the ops
    # that carry it walk the pass's rows, each from its parent's state (recurrent_records.py)
    Op.RECURRENT_STATE: OpKernel(bind_nothing),
    Op.SHORT_CONV: OpKernel(computed(recurrent_records.record_short_conv), recurrent_records.refuse_weights),
    Op.SSM_SCAN: OpKernel(computed(recurrent_records.record_ssm_scan), recurrent_records.refuse_weights),
    Op.DELTA_RULE: OpKernel(computed(recurrent_records.record_delta_rule), recurrent_records.refuse_weights),
    # mixture of experts (moe_records.py): router rows on the device, experts through the type's matvec
    Op.MOE_GATE: OpKernel(computed(moe_records.record_gate)),
    Op.MOE_SELECT: OpKernel(computed(moe_records.record_select)),
    Op.MOE_WEIGHTS: OpKernel(computed(moe_records.record_weights)),
    Op.MOE_MATMUL: OpKernel(computed(moe_records.record_matmul), refuse_matmul),
    Op.MOE_SUM: OpKernel(computed(moe_records.record_sum)),
}

# the orders every reducing kernel sums in (kinetic/ir/orders.py), the reference's: the matvecs in
# ggml's lane or block order of their weight type (F16: its 64 lanes, BF16: vdpbf16ps's pairs), RMS
# norm in float64 (a device without float64 sums in float32, in the same fixed order: batch-invariant,
# within a tolerance of the reference),
# attention in one chain over the keys of an f16 cache
REDUCTION_ORDERS = frozenset({"lanes8", "block_chain", "lanes64", "bf16_pairs", "f64_sum", "key_chain_f16",
                              "mean_var_f64"})
# the device forms (kinetic/passes/device_fusion.py) a device may list; Vulkan has a row for none yet,
# so it runs the graph the generic pipeline made
DEVICE_FORMS = frozenset({Op.ADD_RMS_NORM, Op.ROPE_PAIR, Op.QUANTIZE})
# any number of sequences per pass (Convoy): every row attends over its own cache in the device's pool
# (common/kv_mirror.py); how many caches the pool holds is bounded by one binding (model.py)
CAPABILITIES = Capabilities("vulkan", fused_ops=DEVICE_FORMS & frozenset(KERNELS), reduction_orders=REDUCTION_ORDERS,
                            max_sequences=None)


def unsupported(graph: Graph) -> str | None:
    """Why this graph cannot run on Vulkan (the first node without a row, or refused by its row, or a
    reduction in an order no kernel follows), or None."""
    for node in graph.nodes:
        row = KERNELS.get(node.op)
        if row is None:
            return f"{node.op.value} has no Vulkan kernel yet"
        reason = row.refuse(graph, node)
        if reason:
            return reason
    return refused_order(graph, CAPABILITIES.reduction_orders, "Vulkan")
