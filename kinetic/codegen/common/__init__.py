"""What several devices share, written once; no device package is imported from here, and no device
package imports another (tests/test_imports.py).

Modules: `expf` (glibc's expf constants, which the CPU, CUDA and Vulkan kernels all evaluate),
`libm` (the C library's float functions over arrays, compiled: the host-side exact math of rotary
tables), `tables` (per-pass tables a device uploads: rotary cos/sin, visibility masks),
`kv_mirror` (a device's copy of the sequences' KV caches and the `host_writes` protocol that keeps it
in step), `orders` (the reduction-order check each device's `unsupported` makes against the orders
it declares), `buffers` (liveness planning: which of a pass's values share a buffer) and
`host_lookup` (the embedding lookups the host makes for a table type without a device kernel).
The contract a device's runner meets is kinetic/codegen/runner.py.
"""
