"""CPU code generation: quantized matmul kernels rendered as LLVM IR and JIT-compiled with llvmlite.

Modules: `llvm_ir` (IR text builder), `target` (host features, variants, the int8 dot primitive),
`quant_blocks` (per weight type its block decoders: `block_types`, `blocks_classic`, `blocks_newer`),
`matmul_ir` (the quantized matmul kernel, with `matmul_block_ir`, `matmul_rows_ir`, `matmul_tiles_ir`,
`matmul_columns_ir`), `float_matmul_ir` and `float_ops_ir` (float weights), `activation_ir`
(activation quantizers and rounding), `jit` (compilation and the content-hashed kernel cache),
`matmul` (the Python entry point). See docs/cpu-kernels.md.
"""

from kinetic.codegen.cpu.matmul import SUPPORTED, quantize_activations, quantized_matmul

__all__ = ["SUPPORTED", "quantize_activations", "quantized_matmul"]
