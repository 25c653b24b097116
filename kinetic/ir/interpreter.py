"""The numpy reference interpreter: a graph evaluated by each op's reference.

Owns: evaluating a Graph on one pass of rows, node by node, each by the reference function its
spec names (`OPS[op].reference`, kinetic/ir/reference.py: what every op means), and keeping each
weight decoded once. Does not own: where weights come from (a WeightSource), cache layout or
rollback (the runtime supplies a KVView and commits what the pass returns). Float32 throughout,
with ggml's numerics where they matter (kinetic/ir/numerics).

A pass is a table of rows (`PassRows`, kinetic/ir/rows.py, with the rule of who sees whom); the
interpreter is one runner among the devices' (kinetic/codegen/runner.py's contract).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from kinetic.ir import numerics
from kinetic.ir.graph import Graph, Node
from kinetic.ir.ops import OPS, Op, check_attrs
from kinetic.ir.reference import Evaluation
from kinetic.ir.rows import KVView, PassResult, PassRows


class WeightSource(Protocol):
    def tensor(self, name: str) -> np.ndarray:
        """The stored tensor: raw bytes [rows, row_bytes] for quantized types, typed values otherwise."""


class Interpreter:
    """Runs graphs on numpy; caches each weight dequantized once. A runner (`--device reference`)
    that returns each pass's keys and values for the runtime to commit."""

    in_place = False

    def __init__(self, weights: WeightSource):
        self.weights = weights
        self._dequantized: dict[str, numerics.DequantizedWeight] = {}

    def run(self, graph: Graph, rows: PassRows, kv: KVView) -> PassResult:
        env: dict[int, object] = {}
        ev = Evaluation(self, rows, kv)
        for node in graph.nodes:  # each op's meaning is its spec's reference (kinetic/ir/reference.py)
            env[node.id] = OPS[node.op].reference(ev, node, [env[i] for i in node.inputs])
        outputs = {name: env[node_id] for name, node_id in graph.outputs}
        return PassResult(outputs, ev.new_kv, ev.new_state)

    def close(self) -> None:
        self._dequantized.clear()

    def weight(self, node: Node) -> numerics.DequantizedWeight:
        name = node.attrs.tensor
        if name not in self._dequantized:
            raw = np.asarray(self.weights.tensor(name))
            raw2d = raw.reshape(raw.shape[0], -1) if raw.ndim > 1 else raw.reshape(1, -1)
            self._dequantized[name] = numerics.DequantizedWeight(raw2d, node.type.ggml_type)
        return self._dequantized[name]

    def matmul(self, x: np.ndarray, weight: Node, attrs) -> np.ndarray:
        """A matmul as the reference defines it; device executors override this with their kernels."""
        return numerics.matmul(x, self.weight(weight), attrs.activations, attrs.order or None)

    def expert_weight(self, node: Node, expert: int) -> numerics.DequantizedWeight:
        """Expert `expert`'s [n_out, K] matrix of a stacked [E, n_out, K] weight, decoded once."""
        key = f"{node.attrs.tensor}#{expert}"
        if key not in self._dequantized:
            raw = np.asarray(self.weights.tensor(node.attrs.tensor))[expert]
            self._dequantized[key] = numerics.DequantizedWeight(raw.reshape(raw.shape[0], -1), node.type.ggml_type)
        return self._dequantized[key]

    def expert_matmul(self, x: np.ndarray, weight: Node, expert: int, attrs) -> np.ndarray:
        """Rows x times one expert of a stacked weight (moe_matmul), as matmul does for a 2-D weight."""
        return numerics.matmul(x, self.expert_weight(weight, expert), attrs.activations, attrs.order or None)

    def attend(self, q: np.ndarray, keys: np.ndarray, vals: np.ndarray, visible: np.ndarray, attrs) -> np.ndarray:
        """Attention of some rows over their sequence's keys, as the reference defines it; device
        executors override this with their kernels."""
        return numerics.attention_online(q, keys, vals, visible, attrs)


def evaluate(op: Op, inputs: list[np.ndarray], attrs=None) -> np.ndarray:
    """An op's reference on values alone, for ops that read nothing but their inputs and attributes
    (elementwise ops, take_rows, rope, rms_norm without a weight): what kernel tests compare against."""
    attrs = OPS[op].attrs() if attrs is None else attrs
    check_attrs(op, attrs)
    return OPS[op].reference(None, Node(-1, op, attrs, (), None), inputs)
