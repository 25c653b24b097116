"""Running a graph on the CPU with the generated kernels.

Owns: evaluating a graph like the reference interpreter does, except that quantized matmuls (the
bulk of the work) run through the generated kernels on the stored weight bytes instead of
dequantized float copies. Every other op, and matmuls of types without a kernel, run as the
reference defines them. Both kernels and reference ops compute each row independently, so a batch
still gives each row what it gets alone.

The CPU device opens it (runner.py) only for graphs the compiled step (step.py) cannot run, e.g. an
f32 KV cache. It runs the graph each pass hands it, generic or after the CPU's device phase (a
quantize node's reference keeps its rows as they are: the kernels quantize them, as for any row).
"""

from __future__ import annotations

import numpy as np

from kinetic.codegen.cpu.float_matmul_ir import FLOAT_TYPES
from kinetic.codegen.cpu.matmul import float_matmul, quantized_matmul
from kinetic.codegen.cpu.target import BIT_EXACT, kernel_orders
from kinetic.ir.graph import Node
from kinetic.ir.interpreter import Interpreter, WeightSource

# Splitting a matmul's columns over a second thread pays only when the weight is large enough to
# amortize the hand-off (measured ~15 us per call; see docs/cpu-kernels.md).
TWO_THREADS_FROM_BYTES = 2 * 1024 * 1024


def _has_kernel(wtype, attrs) -> bool:
    """Whether a generated kernel computes this matmul: q8 activations, a type with a kernel, and an
    order (the node's, "" = ggml's) that kernel follows (target.kernel_orders)."""
    return (attrs.activations == "q8" and wtype in BIT_EXACT | set(FLOAT_TYPES)
            and (not attrs.order or attrs.order in kernel_orders(wtype)))


class CpuInterpreter(Interpreter):
    def __init__(self, weights: WeightSource, threads: int = 2):
        super().__init__(weights)
        self.threads = threads

    def matmul(self, x: np.ndarray, weight: Node, attrs) -> np.ndarray:
        wtype = weight.type.ggml_type
        if not _has_kernel(wtype, attrs):
            return super().matmul(x, weight, attrs)
        raw = np.asarray(self.weights.tensor(weight.attrs.tensor))
        raw = raw.reshape(raw.shape[0], -1)
        threads = self.threads if raw.nbytes >= TWO_THREADS_FROM_BYTES else 1
        if wtype in FLOAT_TYPES:  # F16 / BF16 / F32 in ggml's order (numerics.float_dot)
            return float_matmul(x, raw, wtype, threads=threads)
        return quantized_matmul(x, raw, wtype, threads=threads, order=attrs.order or None)

    def expert_matmul(self, x: np.ndarray, weight: Node, expert: int, attrs) -> np.ndarray:
        """One expert's rows of a moe_matmul through the generated kernels on that expert's stored
        bytes (the reference's arithmetic, row by row: moe_reference groups the pass's rows by expert)."""
        wtype = weight.type.ggml_type
        if not _has_kernel(wtype, attrs):
            return super().expert_matmul(x, weight, expert, attrs)
        raw = np.asarray(self.weights.tensor(weight.attrs.tensor))[expert]
        raw = raw.reshape(raw.shape[0], -1)
        threads = self.threads if raw.nbytes >= TWO_THREADS_FROM_BYTES else 1
        if wtype in FLOAT_TYPES:
            return float_matmul(x, raw, wtype, threads=threads)
        return quantized_matmul(x, raw, wtype, threads=threads, order=attrs.order or None)
