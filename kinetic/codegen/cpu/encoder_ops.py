"""The CPU's rows for what encoder (embedding) models add: `layer_norm`, and lookups of a table by
an input other than the tokens (BERT's learned positions and token types).

Owns: their lowerings as Python instructions between compiled segments, each running the op's
reference (kinetic/ir/reference.py) on the step's buffers, so they are the reference's bits by
construction. Hand-written rather than generated kernels for now: these ops run once per layer
norm on rows whose cost is dominated by the matmuls around them (docs/embeddings.md has the
measurement); a generated kernel is the next step. Does not own the tape or the other rows
(lowering.py).
"""

from __future__ import annotations

import numpy as np

from kinetic.ir import numerics
from kinetic.ir.graph import Node
from kinetic.ir.quants import dequantize_rows

F32 = np.float32


def _rows(node: Node, n: int, n_out: int) -> int:
    return n_out if node.type.shape[0] == "R" else n


def layer_norm(b, node: Node, ins: list[Node]) -> None:
    """(x - mean) / sqrt(var + eps) * weight, numerics.layer_norm's order, on the arena's rows."""
    weight = b.reference.weight(ins[1]).values.reshape(-1).astype(F32) if len(ins) == 2 else None
    x, eps = ins[0], node.attrs.eps

    def run(step, n: int, n_out: int) -> None:
        rows = _rows(node, n, n_out)
        y = numerics.layer_norm(step.view(x.id, rows), eps)
        step.view(node.id, rows)[:] = y if weight is None else (y * weight).astype(F32)

    b.add_python(run, reads=(("v", x.id),), writes=(("v", node.id),))


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
