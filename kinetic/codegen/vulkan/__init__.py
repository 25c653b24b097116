"""Vulkan code generation: compute kernels emitted as SPIR-V binary straight from Python, run through
the `vulkan` package on any Vulkan 1.2 device (Mesa's lavapipe included, so CI runs them for real).

Modules: `spirv` (the binary emitter; its numbers in `spirv_spec`), `capabilities` (what a device
has, read from it), `device` (instance, validation-message collector, buffers, pipelines, one
command buffer with barriers), `builders` (exact fma, f16 conversions, fixed-order reductions), the
renderers `elementwise`, `norm`, `rope`, `matvec` (block-32 weights) and `matvec_k` (Q4_K, Q6_K),
and `executor` (single ops from numpy arrays). See docs/devices.md. Nothing here imports the
`vulkan` package at import time; `device.load_vulkan` does, and says what is missing when it cannot.
"""
