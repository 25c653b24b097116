"""Running a graph on the CPU with the generated kernels.

Owns: evaluating a graph like the reference interpreter does, except that quantized matmuls (the
bulk of the work) run through the generated kernels on the stored weight bytes instead of
dequantized float copies. Every other op, and matmuls of types without a kernel, run as the
reference defines them. Both kernels and reference ops compute each row independently, so a batch
still gives each row what it gets alone.

The CPU device opens it (runner.py) only for graphs the compiled step (step.py) cannot run, e.g. an
f32 KV cache.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

from kinetic.codegen.cpu.float_matmul_ir import FLOAT_TYPES
from kinetic.codegen.cpu.matmul import SUPPORTED, float_matmul, quantized_matmul
from kinetic.ir.graph import Node
from kinetic.ir.interpreter import Interpreter, WeightSource

# Types whose kernels sum in exactly the reference's order (the kernels llama.cpp runs for a decode
# row on x86: the block-32 vec-dots, the repacked Q2_K / Q4_K / IQ4_NL / MXFP4 gemvs, the Q3_K / Q5_K /
# Q6_K / IQ4_XS vec-dots), so the CPU device gives bit for bit what the reference interpreter gives
# (tests/codegen/cpu/test_cpu_executor.py checks the equality).
BIT_EXACT = frozenset({Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
                       Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4}) & SUPPORTED

# Splitting a matmul's columns over a second thread pays only when the weight is large enough to
# amortize the hand-off (measured ~15 us per call; see docs/cpu-kernels.md).
TWO_THREADS_FROM_BYTES = 2 * 1024 * 1024


class CpuInterpreter(Interpreter):
    def __init__(self, weights: WeightSource, threads: int = 2):
        super().__init__(weights)
        self.threads = threads

    def matmul(self, x: np.ndarray, weight: Node, attrs) -> np.ndarray:
        wtype = weight.type.ggml_type
        if attrs.activations != "q8" or wtype not in BIT_EXACT | set(FLOAT_TYPES):
            return super().matmul(x, weight, attrs)
        raw = np.asarray(self.weights.tensor(weight.attrs.tensor))
        raw = raw.reshape(raw.shape[0], -1)
        threads = self.threads if raw.nbytes >= TWO_THREADS_FROM_BYTES else 1
        if wtype in FLOAT_TYPES:  # F16 / BF16 / F32 in ggml's order (numerics.float_dot)
            return float_matmul(x, raw, wtype, threads=threads)
        return quantized_matmul(x, raw, wtype, threads=threads)
