"""The CUDA renderer: which kernels a graph's ops become, with the device's capabilities as data.

Owns: mapping IR nodes to kernels (gemv.py, pointwise.py, attention.py, gather.py), and saying
plainly which nodes have no CUDA kernel yet. Does not own: scheduling them, buffers or launches (the
CUDA runtime, issue 10 part 2), or compiling (nvrtc.py).

One renderer serves every listed architecture: the kernels are plain CUDA C without architecture-
specific instructions (dp4a exists on all of them), so the same text compiles for each; what differs
per architecture is only what the capability table (caps.py) allows, which tests check every kernel
against.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cuda import attention, gather, gemv, pointwise
from kinetic.codegen.cuda.caps import ARCHS, BUDGETS, Arch, Budget
from kinetic.codegen.cuda.kernel import Kernel
from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import Op

_ELEMENTWISE_OPS = {Op.ADD: "add", Op.MUL: "mul", Op.SCALE: "scale", Op.SILU: "silu", Op.GELU: "gelu",
                    Op.SWIGLU: "swiglu", Op.GEGLU: "geglu"}
# ops the runtime handles without a kernel of its own (leaves)
_NO_KERNEL = {Op.INPUT, Op.PARAM, Op.STATE}


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


# rows of the KV cache an attention mask row spans when the runtime does not say (render a graph alone)
DEFAULT_MASK_STRIDE = 4096


class CudaRenderer:
    """`mask_stride`: the keys each row of an attention mask holds, which is the runtime's KV cache
    capacity; it is a literal of every attention kernel's text."""

    archs: dict[str, Arch] = ARCHS
    budgets: dict[str, Budget] = BUDGETS

    def __init__(self, *, mask_stride: int = DEFAULT_MASK_STRIDE):
        self.mask_stride = mask_stride

    def matmul(self, node: Node, graph: Graph) -> list[Kernel]:
        weight = graph.node(node.inputs[1])
        wtype = weight.type.ggml_type
        if node.attrs.activations != "q8":
            raise NotImplementedError("float-activation matmuls (activations=f32)")
        if wtype not in gemv.SUPPORTED:
            raise NotImplementedError(f"{wtype.name} weights")
        n_out, k = weight.type.shape
        return [gemv.quantize(gemv.activation_format(wtype), k), gemv.gemv(wtype, n_out, k)]

    def node_kernels(self, node: Node, graph: Graph) -> list[Kernel]:
        """The kernels one node runs; NotImplementedError saying what is missing."""
        a = node.attrs
        if node.op in _NO_KERNEL:
            return []
        if node.op is Op.MATMUL:
            return self.matmul(node, graph)
        width = node.type.shape[1] if len(node.type.shape) == 2 else None
        if node.op is Op.EMBED:
            table = graph.node(node.inputs[0]).type.ggml_type
            if table is not Q.Q8_0:
                raise NotImplementedError(f"{table.name} embedding tables (only Q8_0 has a CUDA lookup)")
            return [gather.embed_q8_0(width)]
        if node.op is Op.TAKE_ROWS:
            return [gather.take_rows(width)]
        if node.op is Op.RMS_NORM:
            return [pointwise.rms_norm(width, a.eps, a.group, weighted=len(node.inputs) == 2)]
        if node.op is Op.ROPE:
            if a.yarn_ext_factor or a.llama3_factor:
                raise NotImplementedError("YaRN and llama3 rotary scaling (the reference lacks them too)")
            return [pointwise.rope(a.n_head, a.head_dim, a.n_rot, a.neox)]
        if node.op is Op.ATTENTION:
            if a.kv_dtype != "f16":
                raise NotImplementedError(f"a {a.kv_dtype} KV cache")
            # the pass's new keys and values go into the cache, then the rows attend over it
            return [gather.kv_store(a.n_kv_head * a.head_dim),
                    attention.attention(a.n_head, a.n_kv_head, a.head_dim, a.scale, a.softcap,
                                        mask_stride=self.mask_stride)]
        if node.op in _ELEMENTWISE_OPS:
            factor = a.factor if node.op is Op.SCALE else 1.0
            return [pointwise.elementwise(_ELEMENTWISE_OPS[node.op], width, factor)]
        raise NotImplementedError(f"op {node.op.value}")

    def render(self, graph: Graph) -> Rendering:
        out = Rendering()
        for node in graph.nodes:
            try:
                out.kernels[node.id] = self.node_kernels(node, graph)
            except NotImplementedError as e:
                out.unsupported[node.id] = f"{node.op.value}: {e}"
        return out
