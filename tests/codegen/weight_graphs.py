"""Small graphs the devices' weight-type tests share (CUDA's and Vulkan's test_*_weight_types.py).

Owns: graph construction only; no device, no assertion."""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from kinetic.ir.graph import Graph, GraphBuilder
from kinetic.ir.ops import InputAttrs, Op
from kinetic.ir.types import TensorType


def matmul_graph(wtype: Q, n_out: int, k: int) -> Graph:
    """tokens -> embed (a Q8_0 table) -> matmul with weights of `wtype` [n_out, k]."""
    b = GraphBuilder()
    tokens = b.add(Op.INPUT, attrs=InputAttrs("tokens"))
    x = b.add(Op.EMBED, (b.param("token_embd.weight", TensorType("q8_0", (32, k))), tokens))
    w = b.param("w.weight", TensorType(wtype.name.lower(), (n_out, k)))
    b.output("out", b.add(Op.MATMUL, (x, w)))
    return b.build()
