"""CPU code generation: quantized matmul kernels rendered as LLVM IR and JIT-compiled with llvmlite.

Modules: `llvm_ir` (IR text builder), `target` (host features, variants, the int8 dot primitive),
`quant_blocks` (per weight type its block decoders: `block_types`, `blocks_classic`, `blocks_newer`),
`matmul_ir` (the quantized matmul kernel, with `matmul_block_ir`, `matmul_rows_ir`, `matmul_tiles_ir`,
`matmul_columns_ir`), `float_matmul_ir` and `float_ops_ir` (float weights), `activation_ir`
(activation quantizers and rounding), `jit` (compilation and the content-hashed kernel cache),
`matmul` (the Python entry point), `expf_ir` and `attention_ir` (attention's score and softmax
kernels). See docs/cpu-kernels.md.

The device (`runner`: `open_runner`) runs a graph as one compiled step (`step`), built through the
op-to-kernel table (`lowering`) into a tape laid out as `tape` names it (`tape_plan`: barriers,
arenas, encoding; `step_kernels`: kernel addresses) and run by a numba driver (`step_ops`,
`step_attention`) on a worker pool (`step_threads`) with per-pass tables (`pass_tables`); graphs the
table cannot lower run op by op (`executor`). `target.CAPABILITIES` is what the CPU declares. See
docs/cpu-step.md.
"""

from kinetic.codegen.cpu.matmul import SUPPORTED, quantize_activations, quantized_matmul

__all__ = ["SUPPORTED", "quantize_activations", "quantized_matmul"]
