"""Where each launch of a CUDA model runs, shared by every pass shape's plan.

Owns: `LaunchOrder`, built once per model from the graph the device phase made: each launch's
position in the graph's order (an add_rms_norm launches where its add stands; a value another launch
computes, such as an absorbed add or a rope_pair's other rotation, has no launch of its own), where
each value is read for the last time (what the liveness planner frees), which producers write a
quantize node's row, the graph's inputs, and the rotary tables and attention windows the passes
stage. Does not own a pass shape's launches and buffers (plan.py), the kernels (renderer.py) or
which fusions the device phase made (kinetic/passes/device_fusion.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from kinetic.ir.graph import Graph, Node
from kinetic.ir.numerics import Rotary
from kinetic.ir.ops import Op
from kinetic.passes.device_fusion import computed_by, quantized_in_producer


@dataclass(frozen=True)
class LaunchOrder:
    """What every plan of a graph shares, whatever its shape: each launch's (position in the graph's
    order, node); per value, the position it is last read at; which producers' launches write a
    quantize node's row (device_fusion.quantized_in_producer); the graph's inputs; the rotary
    tables (one per distinct RopeAttrs.rotary) and attention windows the passes stage."""

    launches: tuple[tuple[int, Node], ...]
    last_read: dict[int, int]
    quantized_by: dict[int, Node]
    inputs: tuple[Node, ...]
    rope_keys: tuple[Rotary, ...]
    windows: tuple[int, ...]

    @staticmethod
    def of(graph: Graph, kernels: dict[int, list], skip: frozenset[int]) -> LaunchOrder:
        """A node launches where it stands, but an add_rms_norm launches where its add stands (its
        other input is a weight) and a value another launch computes has no launch of its own."""
        absorbed = computed_by(graph)  # an add -> its add_rms_norm, a rotation -> its pair
        hoisted = {n.inputs[0]: n for n in graph.nodes if n.op is Op.ADD_RMS_NORM}

        def launch_at(node: Node) -> Node | None:
            if node.id in hoisted:
                return hoisted[node.id]
            if node.op is Op.ADD_RMS_NORM or node.id in absorbed or node.id in skip:
                return None
            return node if kernels.get(node.id) else None

        launches = tuple(launch_at(node) for node in graph.nodes)
        # per position, the values read there: the node's inputs, and those of the launch running there
        reads_at = [set(node.inputs) | set(_launch_reads(graph, launch) if launch else ())
                    for node, launch in zip(graph.nodes, launches, strict=True)]
        last_read = {j: i for i, reads in enumerate(reads_at) for j in reads}
        mine = [n for n in graph.nodes if n.id not in skip]
        rope_keys = sorted({n.attrs.rotary for n in mine if n.op in (Op.ROPE, Op.ROPE_PAIR)})
        return LaunchOrder(tuple((i, launch) for i, launch in enumerate(launches) if launch is not None),
                           last_read, quantized_in_producer(graph),
                           tuple(n for n in graph.nodes if n.op is Op.INPUT), tuple(rope_keys),
                           tuple(sorted({n.attrs.window for n in mine if n.op is Op.ATTENTION})))


def _launch_reads(graph: Graph, node: Node) -> tuple[int, ...]:
    """The values a node's launch reads: its inputs, and those of the values it computes too."""
    if node.op is Op.ADD_RMS_NORM:
        return graph.node(node.inputs[0]).inputs + node.inputs[1:]
    if node.op is Op.ROPE_PAIR:
        return node.inputs[:2] + graph.node(node.inputs[2]).inputs
    return node.inputs
