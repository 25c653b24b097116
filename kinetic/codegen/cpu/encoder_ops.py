"""The CPU's rows for what encoder (embedding) models add: `layer_norm`, and lookups of a table by
an input other than the tokens (BERT's learned positions and token types).

Owns: `layer_norm`'s lowering, one OP_LAYER_NORM on the tape calling the generated kernel of
layer_norm_ir.py (numerics.layer_norm's order, bit for bit; whole rows a share, so no row's sums are
split), and the lookups by input as Python instructions between compiled segments, each running the
reference's dequantization on the step's buffers. Does not own the tape layout (tape.py), the
kernel's IR (layer_norm_ir.py) nor the other rows (lowering.py).
"""

from __future__ import annotations

import numpy as np

from kinetic.codegen.cpu import tape
from kinetic.codegen.cpu.tape_plan import Ref
from kinetic.ir.graph import Node
from kinetic.ir.quants import dequantize_rows

F32 = np.float32


def layer_norm(b, node: Node, ins: list[Node]) -> None:
    """(x - mean) / sqrt(var + eps) [* weight] by the generated kernel, a share's whole rows a call."""
    x, width, weight = ins[0], node.type.shape[1], -1
    if len(ins) == 2:
        ckey = ("c", ins[1].attrs.tensor)
        b.plan.constants[ckey] = b.reference.weight(ins[1]).values.reshape(-1).astype(F32)
        weight = Ref(ckey)
    b.add(tape.OP_LAYER_NORM, {
        tape.NORM_KERNEL: b.kernels.layer_norm(width, node.attrs.eps, weighted=len(ins) == 2),
        tape.NORM_X: Ref(("v", x.id)), tape.NORM_Y: Ref(("v", node.id)), tape.NORM_WEIGHT: weight,
        tape.NORM_WIDTH: width},
        reads=(("v", x.id),), writes=(("v", node.id),), row_local=True, output_rows=node.type.shape[0] == "R",
        width=width, unit=width, whole_row=True)


def refuse_layer_norm(graph, node: Node) -> str | None:
    if len(node.inputs) == 2 and graph.node(node.inputs[1]).op.value != "param":
        return "a layer_norm weight computed in the graph"
    return None


def embed_by_input(b, node: Node, table: Node, ids: Node) -> None:
    """Rows of `table` picked by the pass's `ids` input (positions, token types), dequantized."""
    raw, name = b.weights.tensor(table.attrs.tensor), ids.attrs.name

    def run(step, n: int, n_out: int) -> None:
        picked = step.pass_rows.input(name)
        step.view(node.id, n)[:] = dequantize_rows(raw, table.type.ggml_type, picked).reshape(n, -1)

    b.add_python(run, writes=(("v", node.id),))
