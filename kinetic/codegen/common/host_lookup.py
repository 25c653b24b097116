"""Embedding lookups made on the host for a device: the rows of a pass, dequantized by the host and
uploaded with the pass's other inputs, for a table type the device has no lookup kernel for.

Owns: `HostLookup` (one embed node the host looks up: its table as the weights hold it, the table's
type and width, the pass input holding the ids, and `rows(pass_rows)`, the pass's rows f32 [rows,
width]), `host_lookups(graph, weights, kernel_types)` (which embed nodes of a graph a device leaves to
the host: those whose table type is not among the types it has lookup kernels for, and every lookup by
another input than the tokens, an encoder's learned positions and token types) and
`read_on_device(graph, lookups)` (the values a device's own work reads: a table only host lookups
read is never uploaded). Does not own where the rows go in a pass (each device's staging:
cuda/plan.py, vulkan/recorder.py), which types a device has kernels for (its lookup modules'
`SUPPORTED`) nor the meaning (kinetic/ir/reference.py's `embed`).

Why the host: llama.cpp looks tokens up on the CPU for every backend (the input layer, tok_embd
among it, is kept in host memory: src/llama-model.cpp, dev_input), since a pass reads a handful of
rows of a large table. The host knows a pass's ids before the pass, so it dequantizes those rows with
the reference's own function (quants.dequantize_rows, as reference.embed does): bit for bit the
reference for every type it dequantizes, with no kernel per type on any device, and an untied table
(read by nothing else on the device) is never uploaded. A pass pays the dequantization of its rows
(about 0.01-0.07 ms for a decode step's row of 4096 values, 10-45 ms for a prompt chunk of 512 such
rows in numpy on 2 shared vCPUs) and uploads 4 * width bytes per row beside its other inputs; so the
devices keep their lookup kernels where they have one, and this path serves every other type.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from kinetic.errors import KineticError
from kinetic.ir.graph import Graph
from kinetic.ir.interpreter import WeightSource
from kinetic.ir.ops import Op
from kinetic.ir.quants import dequantize_rows
from kinetic.ir.rows import PassRows


@dataclass(frozen=True, eq=False)
class HostLookup:
    """One embed node the host looks up for a device."""

    node: int
    ids: str  # the pass input holding the row ids: a PassRows field ("tokens")
    table: np.ndarray  # as the weights hold it: raw GGUF rows [n_vocab, row_bytes], or typed values
    ggml_type: GGMLQuantizationType
    width: int

    def rows(self, rows: PassRows) -> np.ndarray:
        """f32 [len(ids), width]: the reference's embed of this pass's ids; an id outside the table is
        a KineticError."""
        ids = np.asarray(rows.input(self.ids))
        if len(ids) and not (0 <= int(ids.min()) and int(ids.max()) < len(self.table)):
            raise KineticError(f"a token id is outside the vocabulary (0..{len(self.table) - 1})",
                               "Check the token ids of the prompt.")
        return dequantize_rows(self.table, self.ggml_type, ids).reshape(len(ids), self.width)


def host_lookups(graph: Graph, weights: WeightSource, kernel_types: Iterable[GGMLQuantizationType],
                 skip: frozenset[int] = frozenset()) -> dict[int, HostLookup]:
    """Per embed node id (but those in `skip`, which run elsewhere), the host lookup of each embed
    whose table type is not in `kernel_types`. An embed's ids are always a pass input (the IR's
    only i32 values), which the host knows before the pass."""
    kernel_types = frozenset(kernel_types)
    lookups = {}
    for node in graph.nodes:
        if node.op is not Op.EMBED or node.id in skip:
            continue
        table, by_tokens = graph.node(node.inputs[0]), graph.node(node.inputs[1]).attrs.name == "tokens"
        if table.type.ggml_type in kernel_types and by_tokens:  # a device's lookup kernels read token ids
            continue
        lookups[node.id] = HostLookup(node.id, graph.node(node.inputs[1]).attrs.name,
                                      weights.tensor(table.attrs.tensor), table.type.ggml_type,
                                      int(node.type.shape[-1]))
    return lookups


def read_on_device(graph: Graph, lookups: dict[int, HostLookup], skip: frozenset[int] = frozenset()) -> set[int]:
    """The ids of the values the device's own work reads: the inputs of every node it runs (all but
    `skip`) other than the host lookups. A table only host lookups read is not among them."""
    return {i for n in graph.nodes if n.id not in skip and n.id not in lookups for i in n.inputs}
