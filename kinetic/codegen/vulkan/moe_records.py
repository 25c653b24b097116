"""What a mixture-of-experts node records on Vulkan (docs/moe.md): the kernel table's rows for
moe_gate, moe_select, moe_weights, moe_matmul and moe_sum, and the check that every expert fits.

Owns: the record functions kernels.py's `KERNELS` rows call (`record_gate`, `record_select`,
`record_weights`, `record_matmul`, `record_sum`), and `refuse_moe_on` (the runner's refusal at load
of a MoE graph the device cannot run: float64 sums without float64, or expert stacks that do not
fit, `check_experts_fit`: Vulkan keeps every expert in device memory; Flywheel's placement between
GPU and CPU is CUDA's, kinetic/codegen/cuda/experts.py). Does not own the kernels' arithmetic
(moe.py for the router and the sum; the per-type matvecs for the experts), buffers (recorder.py) or
the ops' meaning (kinetic/ir/moe_reference.py).

moe_matmul is a matvec per (row, slot): slot s of row r is activation row r * n_used + s (its input
copied once per slot by take_rows when the slots share it, as gate and up do; the down projection's
input already has a row per slot), quantized as a plain matmul's, and multiplied by the weight type's
own matvec with its `experts` binding (matvec.expert_row): every weight row it reads is in the
expert ids[r, s] chose, read from the device buffer moe_select wrote. So each slot is the plain
matvec's product with that expert alone: no row reads another row's expert or depends on how many
rows the pass has.
"""

from __future__ import annotations

import struct

import numpy as np

from kinetic.codegen.vulkan import gather, moe, recurrent
from kinetic.codegen.vulkan.device import Unsupported
from kinetic.codegen.vulkan.dispatch import Dispatch
from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import Op

MIB = 1 << 20


def _rows(n: int) -> bytes:
    return struct.pack("<I", n)


def record_gate(p, node: Node, ins, out, n: int) -> None:
    """The router's probabilities: ggml_soft_max per row (float64 sum), or the sigmoid per value."""
    width = p.width(node)
    if node.attrs.gating == "sigmoid":
        kernel = p.ops.kernel(("sigmoid",), recurrent.render_sigmoid)
        p.dispatch(kernel, [ins[0], p.ops.expf_table(), out], n * width, recurrent.WORKGROUP, n * width)
        return
    kernel = p.ops.kernel(("moe_softmax", width), lambda: moe.render_softmax_gate(p.ops.target, width))
    p.dispatches.append(Dispatch(kernel, [ins[0], p.ops.expf_table(), out],
                                 p.grid(-(-n // moe.ROW_WORKGROUP)), _rows(n)))


def record_select(p, node: Node, ins, out, n: int) -> None:
    """Each row's top-k experts as u32 (plus the file's selection bias, uploaded as an f32 weight)."""
    n_expert, n_used = p.width(p.graph.node(node.inputs[0])), node.attrs.n_used
    bias = [p.model.weights[p.graph.node(node.inputs[1]).attrs.tensor]] if len(node.inputs) == 2 else []
    kernel = p.ops.kernel(("moe_select", n_expert, n_used, bool(bias)),
                          lambda: moe.render_select(n_expert, n_used, bool(bias)))
    p.dispatches.append(Dispatch(kernel, [ins[0], *bias, out], p.grid(-(-n // moe.ROW_WORKGROUP)), _rows(n)))


def record_weights(p, node: Node, ins, out, n: int) -> None:
    """The chosen experts' probabilities, renormalized (float64 sum) and scaled."""
    a = node.attrs
    n_expert, n_used = p.width(p.graph.node(node.inputs[0])), p.width(node)
    kernel = p.ops.kernel(("moe_weights", n_expert, n_used, a.normalize, float(a.scale)),
                          lambda: moe.render_route_weights(n_expert, n_used, a.normalize, a.scale))
    p.dispatches.append(Dispatch(kernel, [ins[0], ins[1], out], p.grid(-(-n // moe.ROW_WORKGROUP)), _rows(n)))


def record_matmul(p, node: Node, ins, out, n: int) -> None:
    """Each (row, slot) through its expert's matrix: slot rows, then the weight type's matvec on the
    stacked weight with the chosen experts bound (module docstring)."""
    w = p.graph.node(node.inputs[1])
    n_expert, n_out, k = w.type.shape
    n_used = p.width(p.graph.node(node.inputs[2]))
    parts = p.model.parts[w.attrs.tensor]
    if len(parts) > 1:  # check_experts_fit refuses this at load; kept for a runner that skipped it
        raise Unsupported(f"the expert stack {w.attrs.tensor} exceeds one storage-buffer binding")
    x = ins[0]
    if p.width(p.graph.node(node.inputs[0])) == k:  # one input row shared by the slots: a copy per slot
        index = p.u32(("moe_slot_rows", n_used), np.repeat(np.arange(n, dtype=np.uint32), n_used))
        x = p.value(("moe_slots", node.id), n * n_used * k * 4)
        p.dispatch(p.ops.take_rows_kernel(k), [ins[0], index, x], n * n_used * k, gather.WORKGROUP, n * n_used)
    p.dispatches += p.ops.matmul_dispatches(
        x, out, parts[0][2], w.type.ggml_type, n * n_used, k, n_out,
        lambda slot, nbytes: p.value(("scratch", node.id, slot), nbytes), expert_ids=ins[2])


def record_sum(p, node: Node, ins, out, n: int) -> None:
    """Each slot's output times its weight, the slots added in order."""
    n_used, width = p.width(p.graph.node(node.inputs[1])), p.width(node)
    kernel = p.ops.kernel(("moe_sum", n_used, width), lambda: moe.render_weighted_sum(n_used, width))
    p.dispatch(kernel, [ins[0], ins[1], out], n * width, moe.WORKGROUP, n)


def expert_stacks(graph: Graph) -> set[str]:
    """The tensor names of the graph's stacked expert weights (moe_matmul's second input)."""
    return {graph.node(node.inputs[1]).attrs.tensor for node in graph.nodes if node.op is Op.MOE_MATMUL}


def check_experts_fit(*, expert_bytes: dict[str, int], other_bytes: int, heap_bytes: int, binding_bytes: int,
                      device: str) -> None:
    """Refuse, with the sizes, a model whose expert stacks cannot all live on this device: Vulkan keeps
    every expert in device memory (no Flywheel here), each stack within one storage-buffer binding
    (its matvec binds the whole stack) and all the weights within the device's largest memory heap."""
    for name, nbytes in expert_bytes.items():
        if nbytes + 16 > binding_bytes:
            raise Unsupported(f"the expert stack {name} is {nbytes / MIB:.1f} MiB, over one storage-buffer "
                              f"binding of {device} ({binding_bytes / MIB:.1f} MiB, maxStorageBufferRange); "
                              "Vulkan binds each stack whole")
    experts = sum(expert_bytes.values())
    if experts and experts + other_bytes > heap_bytes:
        raise Unsupported(f"the experts need {experts / MIB:.1f} MiB and the other weights "
                          f"{other_bytes / MIB:.1f} MiB, more than {device}'s {heap_bytes / MIB:.1f} MiB of "
                          "memory; Vulkan keeps every expert on the device (Flywheel, which runs experts "
                          "that do not fit on the CPU, is CUDA's: use --device cuda or --device cpu)")


def needs_float64(graph: Graph) -> str | None:
    """The first MoE op of the graph whose kernel sums in float64 (the softmax gate, renormalized
    weights), or None."""
    for node in graph.nodes:
        if node.op is Op.MOE_GATE and node.attrs.gating == "softmax":
            return "moe_gate's softmax"
        if node.op is Op.MOE_WEIGHTS and node.attrs.normalize:
            return "moe_weights' renormalization"
    return None


def refuse_moe_on(graph: Graph, tensor_bytes: dict[str, int], caps) -> None:
    """Refuse, before anything is uploaded, a MoE graph this device cannot run: a float64 sum on a
    device without float64, or experts that do not fit (check_experts_fit, the device-read weights
    having these sizes; the device's largest memory heap, one binding)."""
    f64_op = needs_float64(graph)
    if f64_op and not caps.shader_float64:
        raise Unsupported(f"{f64_op} sums in float64 (shaderFloat64), which {caps.device_name} lacks")
    stacks = expert_stacks(graph)
    check_experts_fit(expert_bytes={name: tensor_bytes[name] for name in stacks if name in tensor_bytes},
                      other_bytes=sum(nbytes for name, nbytes in tensor_bytes.items() if name not in stacks),
                      heap_bytes=max(caps.heap_sizes, default=0), binding_bytes=caps.max_storage_buffer_range,
                      device=caps.device_name)
