"""Vulkan code generation: compute kernels emitted as SPIR-V binary straight from Python, run through
the `vulkan` package on any Vulkan 1.2 device (Mesa's lavapipe included, so CI runs them for real).

Modules: `spirv` (the binary emitter: the module; `spirv_function` the entry point's body,
`spirv_types` their shared records, `spirv_spec` the numbers), `capabilities` (what a device has,
read from it), `loader` (the binding and the devices listed), `dispatch` (kernels, buffers,
dispatches, where barriers go), `device` (instance, validation-message collector, buffers,
pipelines, one command buffer with barriers), `builders` (exact fma, f16 conversions, fixed-order
reductions), `frame` (the bindings, push constants and entry most kernels share), the renderers
`elementwise`, `norm`, `rope`, `matvec` (block-32 weights), `matvec_k` (the K-quants),
`matvec_float` (F16, BF16), `matvec_f32` (F32),
`attention` (with glibc's expf) and `gather` (KV store, embedding, take_rows, placing columns);
`ops` (each kernel's cache key, and single ops from numpy arrays), `kernels` (the op-to-kernel
table `KERNELS`, `unsupported`, `CAPABILITIES`), `recorder` (one pass's dispatches and planned
values) and `model` (the whole-model runner for `--device vulkan`). See docs/devices.md. Nothing
here imports the `vulkan` package at import time; `loader.load_vulkan` does, and says what is
missing when it cannot.
"""
