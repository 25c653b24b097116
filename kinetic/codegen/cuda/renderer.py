"""The CUDA renderer: which kernels a graph's ops become, with the device's capabilities as data.

Owns: mapping IR nodes to kernels (gemv.py, pointwise.py, attention.py, gather.py), the chains
fused into one launch (an add of the residual stream and the norm of its result; a layer's key and
value stores), and saying plainly which nodes have no CUDA kernel yet. Does not own: scheduling
them, buffers or launches (the runtime, model.py), or compiling (nvrtc.py).

One renderer serves every listed architecture: the kernels are plain CUDA C without architecture-
specific instructions (dp4a exists on all of them), so the same text compiles for each; what differs
per architecture is only what the capability table (caps.py) allows, which tests check every kernel
against.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cuda import attention, gather, gemv, pointwise, quantize
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
    fused: dict[int, int] = field(default_factory=dict)  # add id -> the norm its launch also computes
    quantized: dict[int, str] = field(default_factory=dict)  # norm id -> the format its launch also writes
    rope_pairs: dict[int, int] = field(default_factory=dict)  # a layer's later rotary -> the earlier one

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
        # the runtime launches the quantizer, then the GEMV for one row or the row-tiled GEMM for more
        return [quantize.quantize(gemv.activation_format(wtype), k), gemv.gemv(wtype, n_out, k),
                gemv.gemm(wtype, n_out, k)]

    def node_kernels(self, node: Node, graph: Graph, fused: dict[int, int] | None = None,
                     quantized: dict[int, str] | None = None, pairs: dict[int, int] | None = None) -> list[Kernel]:
        """The kernels one node runs; NotImplementedError saying what is missing. An add in `fused`
        runs the norm of its result in the same launch (pointwise.rms_norm(residual=True)); a norm in
        `quantized` also writes its row quantized for the matmuls that read it."""
        a = node.attrs
        if node.op in _NO_KERNEL:
            return []
        quantized, pairs = quantized or {}, pairs or {}
        if fused and node.id in fused:
            norm = graph.node(fused[node.id])
            return [pointwise.rms_norm(node.type.shape[1], norm.attrs.eps, norm.attrs.group,
                                       weighted=len(norm.inputs) == 2, residual=True,
                                       quantize=quantized.get(norm.id))]
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
            return [pointwise.rms_norm(width, a.eps, a.group, weighted=len(node.inputs) == 2,
                                       quantize=quantized.get(node.id))]
        if node.op is Op.ROPE:
            if a.yarn_ext_factor or a.llama3_factor:
                raise NotImplementedError("YaRN and llama3 rotary scaling (the reference lacks them too)")
            if node.id in pairs:  # the earlier rotary of the layer too, in one launch
                return [pointwise.rope(graph.node(pairs[node.id]).attrs.n_head, a.head_dim, a.n_rot, a.neox,
                                       n_head_b=a.n_head)]
            return [pointwise.rope(a.n_head, a.head_dim, a.n_rot, a.neox)]
        if node.op is Op.ATTENTION:
            if a.kv_dtype != "f16":
                raise NotImplementedError(f"a {a.kv_dtype} KV cache")
            # the pass's new keys and values go into the cache (one launch for both), then the rows
            # attend over it: one warp per (row, head), or 8 with the keys' work in parallel (the runtime picks)
            shape = (a.n_head, a.n_kv_head, a.head_dim, a.scale, a.softcap)
            return [gather.kv_store(a.n_kv_head * a.head_dim, pair=True),
                    attention.attention(*shape, mask_stride=self.mask_stride),
                    attention.attention_rows(*shape, mask_stride=self.mask_stride, quantize=quantized.get(node.id))]
        if node.op in _ELEMENTWISE_OPS:
            if any(graph.node(i).type.shape != node.type.shape for i in node.inputs):
                raise NotImplementedError("operands of different shapes (a broadcast)")
            factor = a.factor if node.op is Op.SCALE else 1.0
            return [pointwise.elementwise(_ELEMENTWISE_OPS[node.op], width, factor, quantize=quantized.get(node.id))]
        raise NotImplementedError(f"op {node.op.value}")

    def render(self, graph: Graph, skip: frozenset[int] = frozenset()) -> Rendering:
        """Every node's kernels but those in `skip` (a split's first layers, which run elsewhere)."""
        out = Rendering(fused=fused_norms(graph, skip), quantized=quantized_norms(graph, skip),
                        rope_pairs=rope_pairs(graph, skip))
        fused_away = set(out.fused.values()) | set(out.rope_pairs.values())
        for node in graph.nodes:
            if node.id in skip:
                continue
            try:
                out.kernels[node.id] = ([] if node.id in fused_away
                                        else self.node_kernels(node, graph, out.fused, out.quantized,
                                                               out.rope_pairs))
            except NotImplementedError as e:
                out.unsupported[node.id] = f"{node.op.value}: {e}"
        return out


def fused_norms(graph: Graph, skip: frozenset[int] = frozenset()) -> dict[int, int]:
    """add id -> id of an RMS norm of its result over whole rows (the residual stream's add and the
    next layer's norm), which one launch computes with the add."""
    fused: dict[int, int] = {}
    users = graph.users()
    for node in graph.nodes:
        if node.op is not Op.ADD or node.id in skip:
            continue
        for uid in users[node.id]:
            user = graph.node(uid)
            if (user.op is Op.RMS_NORM and user.inputs[0] == node.id and uid not in skip
                    and user.attrs.group in (0, node.type.shape[-1]) and user.type.shape == node.type.shape):
                fused[node.id] = uid
                break
    return fused


# ops whose launch can also write its row quantized (attention: its parallel kernel, attention_rows)
_QUANTIZING = {Op.RMS_NORM, Op.SWIGLU, Op.GEGLU, Op.ATTENTION}


def quantized_norms(graph: Graph, skip: frozenset[int] = frozenset()) -> dict[int, str]:
    """node id -> the activation format its launch also writes: whole-row norms, SwiGLU / GEGLU and
    attention (its parallel kernel) read by matmuls that take Q8_0 or Q8_1 activations, and SwiGLU /
    GEGLU and attention over heads of 256 read by Q8_K ones (the format of the first such matmul;
    others quantize for themselves),
    so the quantizer launches before those matmuls go away."""
    out: dict[int, str] = {}
    users = graph.users()
    for node in graph.nodes:
        if node.op not in _QUANTIZING or node.id in skip or node.type.shape[-1] % 32:
            continue
        if node.op is Op.RMS_NORM and node.attrs.group not in (0, node.type.shape[-1]):
            continue
        for uid in users[node.id]:
            user = graph.node(uid)
            if user.op is Op.MATMUL and user.inputs[0] == node.id and user.attrs.activations == "q8":
                wtype = graph.node(user.inputs[1]).type.ggml_type
                fmt = gemv.activation_format(wtype) if wtype in gemv.SUPPORTED else None
                # Q8_K (super-blocks of 256) only where a 256-thread block holds one super-block
                glu_k = node.op in (Op.SWIGLU, Op.GEGLU) and node.type.shape[-1] % 256 == 0
                head_k = node.op is Op.ATTENTION and node.attrs.head_dim == attention.PAR_THREADS
                if fmt in ("q8_0", "q8_1") or (fmt == "q8_k" and (glu_k or head_k)):
                    out[node.id] = fmt
                    break
    return out


def rope_pairs(graph: Graph, skip: frozenset[int] = frozenset()) -> dict[int, int]:
    """later rotary id -> earlier rotary id, for an attention's query and key rotations with the same
    tables (everything but the head count alike): one launch at the later one does both."""
    from dataclasses import replace

    pairs: dict[int, int] = {}
    position = {n.id: i for i, n in enumerate(graph.nodes)}
    users = graph.users()

    def rotary(node: Node) -> Node:  # through a scale (Gemma scales its queries after the rotation)
        while node.op is Op.SCALE:
            node = graph.node(node.inputs[0])
        return node

    for node in graph.nodes:
        if node.op is not Op.ATTENTION or node.id in skip:
            continue
        q, k = rotary(graph.node(node.inputs[0])), rotary(graph.node(node.inputs[1]))
        if not (q.op is Op.ROPE and k.op is Op.ROPE and q.id not in skip and k.id not in skip
                and q.inputs[1] == k.inputs[1] and replace(q.attrs, n_head=0) == replace(k.attrs, n_head=0)):
            continue
        early, late = sorted((q, k), key=lambda n: position[n.id])
        # the earlier one's values exist only once the later one has run: nothing may read them before
        if all(position[u] > position[late.id] for u in users[early.id]):
            pairs[late.id] = early.id
    return pairs
