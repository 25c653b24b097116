"""The CPU device's entry (`--device cpu`): which of its two runners a graph gets.

Owns: `open_runner`, the compiled step (step.py: one tape per pass, keys and values written in
place) for every graph its op-to-kernel table can lower (lowering.unsupported), else the op-by-op
executor (executor.py: the generated matmul kernels inside the reference interpreter), so the CPU
runs every graph. The compiled step lowers the graph it is given through the CPU's device phase
(lowering.device_graph) when it is built, as CUDA's runner does; a CUDA split's first layers come
here too (kinetic/devices.py: host_runner). Does not own either runner nor the CPU's capabilities
(target.py).
"""

from __future__ import annotations

from kinetic.codegen.runner import Runner, RunnerOptions
from kinetic.ir.graph import Graph
from kinetic.ir.interpreter import WeightSource


def open_runner(graph: Graph, weights: WeightSource, options: RunnerOptions) -> Runner:
    from kinetic.codegen.cpu.lowering import unsupported
    from kinetic.codegen.cpu.step import CompiledStep

    if unsupported(graph) is None:
        return CompiledStep(graph, weights, threads=options.threads, rows=options.batch, matmul=options.matmul)
    from kinetic.codegen.cpu.executor import CpuInterpreter

    return CpuInterpreter(weights)
