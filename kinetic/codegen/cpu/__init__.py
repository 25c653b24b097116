"""CPU code generation: quantized matmul kernels rendered as LLVM IR and JIT-compiled with llvmlite.

Modules: `llvm_ir` (IR text builder), `target` (host features, variants, the int8 dot primitive),
`quant_blocks` (ggml block layouts decoded to int8 vectors), `matmul_ir` and `activation_ir` (the
kernel renderers, which fix the order of summation), `jit` (compilation and the content-hashed kernel
cache), `matmul` (the Python entry point). See docs/cpu-kernels.md.
"""

from kinetic.codegen.cpu.matmul import SUPPORTED, quantize_activations, quantized_matmul

__all__ = ["SUPPORTED", "quantize_activations", "quantized_matmul"]
